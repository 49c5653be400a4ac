module warmup

go 1.24
