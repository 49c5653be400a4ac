// {{name}}: a learning-rate schedule for lsgd-host. Edit info, configure, learningRate and
// stepMomentum; the host calls describe once, configure once, then learningRate and momentum
// every step. lsgd_plugin.go, lsgd_schedule.go and lsgd_momentum.go are the contract's ABI and
{{^stateful}}
// the describe/configure helpers.
{{/stateful}}
{{#stateful}}
// the describe/configure helpers, lsgd_state.go the ABI of snapshot and restore.
//
// It keeps state between calls: the best metric seen so far, which lowers the rate as the metric
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
	Summary: "A constant learning rate: base_lr x B/B_ref x scale",
{{/stateful}}
{{#stateful}}
	Summary: "base_lr x B/B_ref x scale x (1 - the best metric so far)",
{{/stateful}}
	Params: []Spec{
		FloatParam("scale", 1.0, "multiplier on the linearly scaled learning rate (>= 0)"),
	},
}

// Set by configure; a fresh instance (the host makes one after any fault) starts at the default.
var scale = 1.0
{{#stateful}}

// The state: the best metric (test accuracy) seen so far, 0 before the first. It changes in the
// policy calls, starts afresh with new parameters, and travels as its 8 bytes (a little-endian
// f64) through snapshot and restore.
var best = 0.0
{{/stateful}}

func configure(p Params) error {
	s, err := FloatAtLeast(p, "scale", 0)
	if err == nil {
		scale = s
{{#stateful}}
		best = 0 // new parameters, a new state
{{/stateful}}
	}
	return err
}

func learningRate(s *State) float64 {
{{#stateful}}
	// Taking the larger value twice changes nothing: the host may call again at one step.
	if s.HasLastMetric && s.LastMetric > best {
		best = s.LastMetric
	}
{{/stateful}}
	ratio := 1.0
	if s.ReferenceBatch != 0 {
		ratio = float64(s.GlobalBatch) / float64(s.ReferenceBatch)
	}
	return s.BaseLR * ratio * scale{{#stateful}} * (1 - best){{/stateful}}
}

// stepMomentum is the momentum of the step, asked right after learningRate with the same state:
// (m, true) with m in [0, 1) sets SGD's momentum (AdamW's beta1) for the step, e.g.
// `return 0.9, true`; ok == false keeps the configured one (--momentum, --adam-beta1), as does
// leaving lsgd_momentum.go's `momentum` nil.
func stepMomentum(s *State) (float64, bool) {
	return 0, false
}

func init() { momentum = stepMomentum }
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
