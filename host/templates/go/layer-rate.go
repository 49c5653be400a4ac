// {{name}}: a layer-wise rate policy for lsgd-host. Edit info, configure and multipliers; the
// host calls describe once, configure once, then multipliers every step with the norms of every
// parameter tensor, and scales the step's learning rate for tensor i by the i-th multiplier (one
// per tensor, each finite and >= 0). lsgd_plugin.go and lsgd_layer_rate.go are the contract's
// ABI and the describe/configure helpers.
//
// This one is LARS (You et al., 2017): a weight's multiplier is its trust ratio
// coefficient x ||w|| / (||g|| + weight_decay x ||w||); biases, BatchNorm parameters and tensors
// with a zero norm keep the schedule's rate (multiplier 1).
package main

var info = Info{
	Name:    "{{name}}",
	Version: "0.1.0",
	Summary: "LARS: coefficient x ||w|| / (||g|| + wd x ||w||) per weight, 1 elsewhere",
	Params: []Spec{
		FloatParam("coefficient", 0.001, "LARS trust coefficient (>= 0)"),
	},
}

// Set by configure; a fresh instance (the host makes one after any fault) starts at the default.
var coefficient = 0.001

func configure(p Params) error {
	c, err := FloatAtLeast(p, "coefficient", 0)
	if err == nil {
		coefficient = c
	}
	return err
}

// trustRatio is LARS's local learning rate of one tensor: finite and >= 0 for any finite norms.
func trustRatio(t *Tensor) float64 {
	w, g := t.WeightNorm, t.GradNorm
	if t.Role != RoleWeight || !(w > 0 && g > 0) {
		return 1
	}
	return coefficient * w / (g + t.WeightDecay*w)
}

func multipliers(s *State, tensors []Tensor) []float64 {
	// Exactly one multiplier per tensor, in the order of `tensors`.
	out := make([]float64, len(tensors))
	for i := range tensors {
		out[i] = trustRatio(&tensors[i])
	}
	return out
}
