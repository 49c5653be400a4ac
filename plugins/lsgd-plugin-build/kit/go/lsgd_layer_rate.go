// lsgd_layer_rate.go: the `layer-rate` interface (contract 0.3.0 and later) for Go plugins; the
// plugin defines `func multipliers(s *State, tensors []Tensor) []float64`, one learning-rate
// multiplier per tensor in the order of `tensors`, each finite and >= 0.
//
// Unlike the other kinds' functions, `multipliers` does not take its arguments as flat core
// values: the train-state (16 values) and the list (pointer, length) flatten to 18, above the
// canonical ABI's limit of 16, so the host stores the argument tuple in linear memory (with
// cabi_realloc) and passes its address. Its result, a list<f64> (2 values where 1 is the limit
// for results), goes back the same way: the address of a (pointer, length) pair.
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

// Tensor is one parameter tensor at this step (WIT tensor-norms): L2 norms computed by the
// host in f64; see wit/policy.wit for what each one measures.
type Tensor struct {
	Name        string
	Shape       []uint32
	Role        Role
	WeightNorm  float64
	GradNorm    float64
	UpdateNorm  float64
	WeightDecay float64
}

//go:wasmexport lsgd:policy/layer-rate@0.3.0#multipliers
func exportMultipliers(args uint32) uint32 {
	ensureConfigured()
	// The argument tuple: train-state @0, list<tensor-norms> @120 (pointer, length).
	s := getState(args)
	list, n := get32(args+120), get32(args+124)
	// tensor-norms, 56 bytes each (alignment 8): name @0 (pointer, length), shape @8 (pointer,
	// length of u32s), role @16 (one byte), weight-norm @24, grad-norm @32, update-norm @40,
	// weight-decay @48.
	tensors := make([]Tensor, n)
	for i := range tensors {
		at, t := list+56*uint32(i), &tensors[i]
		t.Name = getString(at)
		p, m := get32(at+8), get32(at+12)
		t.Shape = make([]uint32, m)
		for j := range t.Shape {
			t.Shape[j] = get32(p + 4*uint32(j))
		}
		t.Role = Role(get8(at + 16))
		t.WeightNorm = getF64(at + 24)
		t.GradNorm = getF64(at + 32)
		t.UpdateNorm = getF64(at + 40)
		t.WeightDecay = getF64(at + 48)
	}
	// Everything is copied out: the host's buffers (from cabi_realloc) may be collected now.
	retained = nil
	out := multipliers(&s, tensors)
	values := alloc(uint32(8*len(out)), 8)
	for i, v := range out {
		put64(values+uint32(8*i), math.Float64bits(v))
	}
	ret := alloc(8, 4)
	put32(ret, values)
	put32(ret+4, uint32(len(out)))
	return ret
}
