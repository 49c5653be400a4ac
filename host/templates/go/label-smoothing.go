// {{name}}: a label-smoothing policy for lsgd-host. Edit info, configure and epsilon; the
// host calls describe once, configure once, then epsilon every step. lsgd_plugin.go and
// lsgd_label_smoothing.go are the contract's ABI and the describe/configure helpers.
{{#stateful}}
// lsgd_state.go is the ABI of snapshot and restore.
//
// It keeps state between calls: the best metric seen so far, which lowers epsilon as the metric
// rises, and which the host saves with snapshot and brings back with restore.
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
	Summary: "A constant label-smoothing epsilon",
{{/stateful}}
{{#stateful}}
	Summary: "epsilon x (1 - the best metric so far)",
{{/stateful}}
	Params: []Spec{
		FloatParam("epsilon", 0.1, "label-smoothing epsilon, in [0, 1)"),
	},
}

// Set by configure; a fresh instance (the host makes one after any fault) starts at the default.
var eps float32 = 0.1
{{#stateful}}

// The state: the best metric (test accuracy) seen so far, 0 before the first. It changes in the
// policy calls, starts afresh with new parameters, and travels as its 8 bytes (a little-endian
// f64) through snapshot and restore.
var best = 0.0
{{/stateful}}

func configure(p Params) error {
	e := p["epsilon"].Float
	// Checked after the f32 conversion the contract requires: 0.999999999 rounds to 1.
	if !(e >= 0 && float32(e) < 1) {
		return Error("epsilon must be in [0, 1), got " + Fmt(e))
	}
	eps = float32(e)
{{#stateful}}
	best = 0 // new parameters, a new state
{{/stateful}}
	return nil
}

{{^stateful}}
func epsilon(s *State) float32 { return eps }
{{/stateful}}
{{#stateful}}
func epsilon(s *State) float32 {
	// Taking the larger value twice changes nothing: the host may call again at one step.
	if s.HasLastMetric && s.LastMetric > best {
		best = s.LastMetric
	}
	// Computed in f64 and rounded to f32 once, as in every language.
	return float32(float64(eps) * (1 - best))
}
{{/stateful}}
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
