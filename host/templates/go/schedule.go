// {{name}}: a learning-rate schedule for lsgd-host. Edit info, configure and learningRate;
// the host calls describe once, configure once, then learningRate every step. lsgd_plugin.go
// and lsgd_schedule.go are the contract's ABI and the describe/configure helpers.
package main

var info = Info{
	Name:    "{{name}}",
	Version: "0.1.0",
	Summary: "A constant learning rate: base_lr x B/B_ref x scale",
	Params: []Spec{
		FloatParam("scale", 1.0, "multiplier on the linearly scaled learning rate (>= 0)"),
	},
}

// Set by configure; a fresh instance (the host makes one after any fault) starts at the default.
var scale = 1.0

func configure(p Params) error {
	s, err := FloatAtLeast(p, "scale", 0)
	if err == nil {
		scale = s
	}
	return err
}

func learningRate(s *State) float64 {
	ratio := 1.0
	if s.ReferenceBatch != 0 {
		ratio = float64(s.GlobalBatch) / float64(s.ReferenceBatch)
	}
	return s.BaseLR * ratio * scale
}
