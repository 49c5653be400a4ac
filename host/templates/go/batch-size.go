// {{name}}: a batch-size controller for lsgd-host. Edit info, configure and globalBatch; the
// host calls describe once, configure once, then globalBatch every step. lsgd_plugin.go and
// lsgd_batch_size.go are the contract's ABI and the describe/configure helpers.
package main

import "math"

var info = Info{
	Name:    "{{name}}",
	Version: "0.1.0",
	Summary: "A constant global batch: the configured one x factor",
	Params: []Spec{
		IntegerParam("factor", 1, "multiplier on the configured global batch (>= 1)"),
	},
}

// Set by configure; a fresh instance (the host makes one after any fault) starts at the default.
var factor uint32 = 1

func configure(p Params) error {
	f, err := U32AtLeast(p, "factor", 1)
	if err == nil {
		factor = f
	}
	return err
}

func globalBatch(s *State) uint32 {
	// A multiple of the configured batch stays divisible by the world size.
	return uint32(min(uint64(s.GlobalBatch)*uint64(factor), math.MaxUint32))
}
