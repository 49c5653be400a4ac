// {{name}}: a label-smoothing policy for lsgd-host. Edit info, configure and epsilon; the
// host calls describe once, configure once, then epsilon every step. lsgd_plugin.go and
// lsgd_label_smoothing.go are the contract's ABI and the describe/configure helpers.
package main

var info = Info{
	Name:    "{{name}}",
	Version: "0.1.0",
	Summary: "A constant label-smoothing epsilon",
	Params: []Spec{
		FloatParam("epsilon", 0.1, "label-smoothing epsilon, in [0, 1)"),
	},
}

// Set by configure; a fresh instance (the host makes one after any fault) starts at the default.
var eps float32 = 0.1

func configure(p Params) error {
	e := p["epsilon"].Float
	// Checked after the f32 conversion the contract requires: 0.999999999 rounds to 1.
	if !(e >= 0 && float32(e) < 1) {
		return Error("epsilon must be in [0, 1), got " + Fmt(e))
	}
	eps = float32(e)
	return nil
}

func epsilon(s *State) float32 { return eps }
