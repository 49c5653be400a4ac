// lsgd_sync.go: the `sync` interface (contract 0.5.0 and later) for Go plugins; the plugin
// defines
//
//	func plan(s *State, w Window) StepKind
//	func outerStep(s *State, w Window, tensors []Drift) OuterStep
//
// plan says how step s.Step moves (Synchronous only at a window's start, w.LocalSteps == 0);
// outerStep is called after each step that plan made Average, with the window as plan saw it
// and the drift of every parameter tensor, and returns the outer step on the averaged
// pseudo-gradient (Averaging() for plain averaging).
//
// Neither function takes its arguments as flat core values: the train-state (16 values) and the
// window (2) flatten to 18, above the canonical ABI's limit of 16, so the host stores the
// argument tuple in linear memory (with cabi_realloc) and passes its address. plan's result, an
// enum, is one core value; outer-step's record (5 values, where 1 is the limit for results)
// goes back as the address of the record in linear memory.
package main

import "math"

// Role is what a parameter tensor is (WIT enum role, stored as one byte).
type Role uint8

// The cases of role, in WIT order.
const (
	// RoleWeight is a weight of a convolution or a linear layer.
	RoleWeight Role = iota
	// RoleBias is a bias of a convolution or a linear layer.
	RoleBias
	// RoleBatchNorm is a BatchNorm scale (gamma) or shift (beta).
	RoleBatchNorm
)

// StepKind is how one step moves (WIT enum step-kind).
type StepKind uint32

// The cases of step-kind, in WIT order.
const (
	// Synchronous sums the gradients over the ranks before the update, as without a sync
	// policy; only at a window's start (Window.LocalSteps == 0).
	Synchronous StepKind = iota
	// Local updates each rank's own weights from its own gradients; nothing is exchanged.
	Local
	// Average is a local step that ends the window: the ranks then average their
	// pseudo-gradients and the host takes the outer step that outerStep returns.
	Average
)

// Window is where the run stands in its synchronisation windows (WIT window).
type Window struct {
	// LocalSteps is the local steps taken since the ranks last agreed on the weights, not
	// counting this one.
	LocalSteps uint32
	// Windows is the windows ended so far: outer steps taken.
	Windows uint64
}

// Drift is one parameter tensor at the end of a window (WIT tensor-drift): L2 norms computed
// by the host in f64; see wit/policy.wit for what each one measures.
type Drift struct {
	Name             string
	Shape            []uint32
	Role             Role
	WeightNorm       float64
	DeltaNorm        float64
	RankDeltaNorm    float64
	MomentumNorm     float64
	DeltaDotMomentum float64
}

// OuterStep is the outer step on the averaged pseudo-gradient delta, in torch.optim.SGD's form
// (dampening 0): m = Momentum*m + delta; d = delta + Momentum*m if Nesterov, else m;
// theta_global -= LR * LRScale[i] * d. LR finite and >= 0, Momentum finite and in [0, 1),
// LRScale empty (1 everywhere) or one finite multiplier >= 0 per tensor.
type OuterStep struct {
	LR       float64
	Momentum float64
	Nesterov bool
	LRScale  []float64
}

// Averaging is the outer step of plain averaging (local SGD, Federated Averaging): theta_global
// becomes the ranks' mean.
func Averaging() OuterStep {
	return OuterStep{LR: 1}
}

// getWindow reads a window record (16 bytes, alignment 8) at `at`.
func getWindow(at uint32) Window {
	return Window{LocalSteps: get32(at), Windows: get64(at + 8)}
}

//go:wasmexport lsgd:policy/sync@0.5.0#plan
func exportPlan(args uint32) uint32 {
	ensureConfigured()
	// The argument tuple: train-state @0, window @120.
	s, w := getState(args), getWindow(args+120)
	// Everything is copied out: the host's buffers (from cabi_realloc) may be collected now.
	retained = nil
	return uint32(plan(&s, w))
}

//go:wasmexport lsgd:policy/sync@0.5.0#outer-step
func exportOuterStep(args uint32) uint32 {
	ensureConfigured()
	// The argument tuple: train-state @0, window @120, list<tensor-drift> @136 (pointer,
	// length).
	s, w := getState(args), getWindow(args+120)
	list, n := get32(args+136), get32(args+140)
	// tensor-drift, 64 bytes each (alignment 8): name @0 (pointer, length), shape @8 (pointer,
	// length of u32s), role @16 (one byte), weight-norm @24, delta-norm @32, rank-delta-norm
	// @40, momentum-norm @48, delta-dot-momentum @56.
	tensors := make([]Drift, n)
	for i := range tensors {
		at, t := list+64*uint32(i), &tensors[i]
		t.Name = getString(at)
		p, m := get32(at+8), get32(at+12)
		t.Shape = make([]uint32, m)
		for j := range t.Shape {
			t.Shape[j] = get32(p + 4*uint32(j))
		}
		t.Role = Role(get8(at + 16))
		t.WeightNorm = getF64(at + 24)
		t.DeltaNorm = getF64(at + 32)
		t.RankDeltaNorm = getF64(at + 40)
		t.MomentumNorm = getF64(at + 48)
		t.DeltaDotMomentum = getF64(at + 56)
	}
	retained = nil
	out := outerStep(&s, w, tensors)
	// outer-step, 32 bytes (alignment 8): lr @0, momentum @8, nesterov @16 (one byte),
	// lr-scale @20 (pointer, length).
	scales := alloc(uint32(8*len(out.LRScale)), 8)
	for i, v := range out.LRScale {
		put64(scales+uint32(8*i), math.Float64bits(v))
	}
	ret := alloc(32, 8)
	put64(ret, math.Float64bits(out.LR))
	put64(ret+8, math.Float64bits(out.Momentum))
	if out.Nesterov {
		put8(ret+16, 1)
	} else {
		put8(ret+16, 0)
	}
	put32(ret+20, scales)
	put32(ret+24, uint32(len(out.LRScale)))
	return ret
}
