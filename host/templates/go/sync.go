// {{name}}: a synchronisation policy for lsgd-host. Edit info, configure, plan and outerStep;
// the host calls describe once, configure once, then plan before every step, and outerStep
// after each step that plan made Average, with the drift of every parameter tensor over the
// window. lsgd_plugin.go and lsgd_sync.go are the contract's ABI and the describe/configure
// helpers.
{{#stateful}}
// lsgd_state.go is the ABI of snapshot and restore.
{{/stateful}}
//
// This one is local SGD (Lin et al. 2018; Federated Averaging with every client): each rank
// takes `period` steps on its own shard, the last of which ends the window (Average), and the
// outer step is plain averaging, which makes the agreed weights the ranks' mean.
{{#stateful}}
//
// It keeps state between calls: the best metric seen so far, which doubles the period once it
// reaches 0.5, and which the host saves with snapshot and brings back with restore.
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
	Summary: "Local SGD: average the ranks' weights every period steps",
{{/stateful}}
{{#stateful}}
	Summary: "Local SGD: average every period steps, twice as long once the best metric reaches 0.5",
{{/stateful}}
	Params: []Spec{
		IntegerParam("period", 8, "steps per window; the ranks average at a window's last step (>= 1)"),
	},
}

// Set by configure; a fresh instance (the host makes one after any fault) starts at the default.
var period uint32 = 8
{{#stateful}}

// The state: the best metric (test accuracy) seen so far, 0 before the first. It changes in the
// policy calls, starts afresh with new parameters, and travels as its 8 bytes (a little-endian
// f64) through snapshot and restore.
var best = 0.0
{{/stateful}}

func configure(p Params) error {
	h, err := U32AtLeast(p, "period", 1)
	if err == nil {
		period = h
{{#stateful}}
		best = 0 // new parameters, a new state
{{/stateful}}
	}
	return err
}

// plan says how step s.Step moves: Local (each rank on its own), Average (a local step that
// ends the window) or Synchronous (the gradients summed over the ranks, as without a sync
// policy; only at a window's start, w.LocalSteps == 0). Every rank must decide alike: only s, w
// and the plugin's state may count.
func plan(s *State, w Window) StepKind {
{{#stateful}}
	// Taking the larger value twice changes nothing: the host may call again at one step.
	if s.HasLastMetric && s.LastMetric > best {
		best = s.LastMetric
	}
{{/stateful}}
	steps := uint64(period)
{{#stateful}}
	if best >= 0.5 {
		steps *= 2
	}
{{/stateful}}
	// w.LocalSteps local steps are behind this one in the window.
	if uint64(w.LocalSteps) >= steps-1 {
		return Average
	}
	return Local
}

// outerStep is the outer step on delta, the pseudo-gradient theta_global - theta_k averaged
// over the ranks: m = Momentum*m + delta; d = delta + Momentum*m with Nesterov, else m;
// theta_global -= LR * LRScale[i] * d. Plain averaging (Averaging()) is LR 1 and no momentum;
// DiLoCo's outer Nesterov step would be OuterStep{LR: 0.7, Momentum: 0.9, Nesterov: true}.
// LRScale is empty (1 for every tensor) or one multiplier per tensor, in the order of
// `tensors`, whose norms (WeightNorm, DeltaNorm, RankDeltaNorm ...) describe the window's drift.
func outerStep(s *State, w Window, tensors []Drift) OuterStep {
	return Averaging()
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
