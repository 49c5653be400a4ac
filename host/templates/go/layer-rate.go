// {{name}}: a layer-wise rate policy for lsgd-host. Edit info, configure and multipliers; the
// host calls describe once, configure once, then multipliers every step with the norms of every
// parameter tensor, and scales the step's learning rate for tensor i by the i-th multiplier (one
// per tensor, each finite and >= 0). lsgd_plugin.go and lsgd_layer_rate.go are the contract's
// ABI and the describe/configure helpers.
//
// This one is LARS (You et al., 2017): a weight's multiplier is its trust ratio
// coefficient x ||w|| / (||g|| + weight_decay x ||w||); biases, BatchNorm parameters and tensors
// with a zero norm keep the schedule's rate (multiplier 1).
{{#stateful}}
//
// It keeps state between calls: the best metric seen so far, which lowers the coefficient to
// coefficient x (1 - best) as the metric rises, and which the host saves with snapshot (its ABI
// is lsgd_state.go) and brings back with restore.
{{/stateful}}
package main
{{#stateful}}

import (
	"encoding/binary"
	"math"
)
{{/stateful}}

var info = Info{
	Name:    "{{name}}",
	Version: "0.1.0",
{{^stateful}}
	Summary: "LARS: coefficient x ||w|| / (||g|| + wd x ||w||) per weight, 1 elsewhere",
{{/stateful}}
{{#stateful}}
	Summary: "LARS with the coefficient x (1 - the best metric so far) per weight, 1 elsewhere",
{{/stateful}}
	Params: []Spec{
		FloatParam("coefficient", 0.001, "LARS trust coefficient (>= 0)"),
	},
}

// Set by configure; a fresh instance (the host makes one after any fault) starts at the default.
var coefficient = 0.001
{{#stateful}}

// The state: the best metric (test accuracy) seen so far, 0 before the first. It changes in the
// policy calls, starts afresh with new parameters, and travels as its 8 bytes (a little-endian
// f64) through snapshot and restore.
var best = 0.0
{{/stateful}}

func configure(p Params) error {
	c, err := FloatAtLeast(p, "coefficient", 0)
	if err == nil {
		coefficient = c
{{#stateful}}
		best = 0 // new parameters, a new state
{{/stateful}}
	}
	return err
}

// trustRatio is LARS's local learning rate of one tensor: finite and >= 0 for any finite norms.
func trustRatio(t *Tensor) float64 {
	w, g := t.WeightNorm, t.GradNorm
	if t.Role != RoleWeight || !(w > 0 && g > 0) {
		return 1
	}
	return coefficient{{#stateful}} * (1 - best){{/stateful}} * w / (g + t.WeightDecay*w)
}

func multipliers(s *State, tensors []Tensor) []float64 {
{{#stateful}}
	// Taking the larger value twice changes nothing: the host may call again at one step.
	if s.HasLastMetric && s.LastMetric > best {
		best = s.LastMetric
	}
{{/stateful}}
	// Exactly one multiplier per tensor, in the order of `tensors`.
	out := make([]float64, len(tensors))
	for i := range tensors {
		out[i] = trustRatio(&tensors[i])
	}
	return out
}
{{#stateful}}

func snapshot() []byte {
	return binary.LittleEndian.AppendUint64(nil, math.Float64bits(best))
}

func restore(b []byte) error {
	if err := CheckSnapshot(b, 8); err != nil {
		return err
	}
	best = math.Float64frombits(binary.LittleEndian.Uint64(b))
	return nil
}
{{/stateful}}
