// {{name}}: a batch-size controller for lsgd-host. Edit info, configure and globalBatch; the
// host calls describe once, configure once, then globalBatch every step. lsgd_plugin.go and
// lsgd_batch_size.go are the contract's ABI and the describe/configure helpers.
{{#stateful}}
// lsgd_state.go is the ABI of snapshot and restore.
//
// It keeps state between calls: the best metric seen so far, which doubles the batch once it
// reaches 0.5, and which the host saves with snapshot and brings back with restore.
{{/stateful}}
package main

{{^stateful}}
import "math"
{{/stateful}}
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
	Summary: "A constant global batch: the configured one x factor",
{{/stateful}}
{{#stateful}}
	Summary: "The configured global batch x factor, doubled once the best metric reaches 0.5",
{{/stateful}}
	Params: []Spec{
		IntegerParam("factor", 1, "multiplier on the configured global batch (>= 1)"),
	},
}

// Set by configure; a fresh instance (the host makes one after any fault) starts at the default.
var factor uint32 = 1
{{#stateful}}

// The state: the best metric (test accuracy) seen so far, 0 before the first. It changes in the
// policy calls, starts afresh with new parameters, and travels as its 8 bytes (a little-endian
// f64) through snapshot and restore.
var best = 0.0
{{/stateful}}

func configure(p Params) error {
	f, err := U32AtLeast(p, "factor", 1)
	if err == nil {
		factor = f
{{#stateful}}
		best = 0 // new parameters, a new state
{{/stateful}}
	}
	return err
}

func globalBatch(s *State) uint32 {
{{#stateful}}
	// Taking the larger value twice changes nothing: the host may call again at one step.
	if s.HasLastMetric && s.LastMetric > best {
		best = s.LastMetric
	}
{{/stateful}}
	// A multiple of the configured batch stays divisible by the world size.
{{^stateful}}
	return uint32(min(uint64(s.GlobalBatch)*uint64(factor), math.MaxUint32))
{{/stateful}}
{{#stateful}}
	b := uint64(s.GlobalBatch) * uint64(factor)
	if best >= 0.5 {
		b *= 2
	}
	return uint32(min(b, math.MaxUint32))
{{/stateful}}
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
