// lsgd_state.go: the `state` interface (contract 0.3.0 and later) for Go plugins of a
// `stateful-*` world; the plugin defines `func snapshot() []byte` (its state, in a form only it
// reads; taking it must change nothing) and `func restore(b []byte) error` (an Error for bytes it
// cannot read). Lists travel through linear memory: restore gets the snapshot's (pointer,
// length), and both return the address of their result, snapshot's a (pointer, length) pair,
// restore's a result<_, string> laid out as configure's.
package main

import "strconv"

//go:wasmexport lsgd:policy/state@0.3.0#snapshot
func exportSnapshot() uint32 {
	b := snapshot()
	// The previous call's result has been read by now: its buffers may be collected.
	retained = nil
	p := alloc(uint32(len(b)), 1)
	copy(mem(p, uint32(len(b))), b)
	ret := alloc(8, 4)
	put32(ret, p)
	put32(ret+4, uint32(len(b)))
	return ret
}

//go:wasmexport lsgd:policy/state@0.3.0#restore
func exportRestore(ptr, n uint32) uint32 {
	// A restored state must survive the first policy call, which would configure from the
	// defaults (and so start a fresh state) if configure had not run yet.
	ensureConfigured()
	b := append([]byte(nil), mem(ptr, n)...)
	retained = nil
	err := restore(b)
	ret := alloc(12, 4)
	if err != nil {
		put8(ret, 1)
		putString(ret+4, err.Error())
	} else {
		put8(ret, 0)
	}
	return ret
}

// CheckSnapshot is nil if a snapshot holds `size` bytes, else the Error that restore returns
// (the Rust plugins' words).
func CheckSnapshot(b []byte, size int) error {
	if len(b) != size {
		return Error("a snapshot of " + strconv.Itoa(len(b)) + " bytes, expected " + strconv.Itoa(size))
	}
	return nil
}
