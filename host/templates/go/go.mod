module {{crate}}

go 1.24
