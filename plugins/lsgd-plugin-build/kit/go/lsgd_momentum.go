// lsgd_momentum.go: the schedule's `momentum` (contract 0.4.0 and later) for Go plugins. It is
// optional: while `momentum` is nil the plugin answers none at every step, which keeps the
// configured momentum (`--momentum`, or AdamW's `--adam-beta1`). A plugin that drives it assigns a
// function in an init function,
//
//	func init() { momentum = func(s *State) (float64, bool) { return 0.9, true } }
//
// returning ok == false for none, a value in [0, 1) otherwise. `lsgd-host new` and
// `lsgd-plugin-build go-kit` add this file to a 0.4 schedule; a schedule of an older contract
// must not have it (its world has no momentum to export).
package main

import (
	"math"
	"unsafe"
)

// momentum gives the momentum of a step, asked right after learningRate with the same state;
// nil answers none at every step.
var momentum func(s *State) (float64, bool)

// momentumRet is where an option<f64> goes back (a flag byte, the value 8 bytes on): two flat
// values, above the limit of one for results. A global, not an alloc: this is called every
// step, and the retained buffers are only released by describe, configure and multipliers.
var momentumRet [2]uint64

//go:wasmexport lsgd:policy/schedule@0.4.0#momentum
func exportMomentum(step uint64, epoch uint32, epochFraction float64, stepsPerEpoch, totalSteps uint64,
	totalEpochs uint32, samplesSeen uint64, globalBatch, workerBatch, worldSize uint32, baseLR float64,
	referenceBatch uint32, hasLoss uint32, loss float64, hasMetric uint32, metric float64) uint32 {
	ensureConfigured()
	ret := uint32(uintptr(unsafe.Pointer(&momentumRet)))
	put8(ret, 0)
	if momentum != nil {
		s := State{step, epoch, epochFraction, stepsPerEpoch, totalSteps, totalEpochs, samplesSeen,
			globalBatch, workerBatch, worldSize, baseLR, referenceBatch, hasLoss != 0, hasMetric != 0, loss, metric}
		if m, ok := momentum(&s); ok {
			put8(ret, 1)
			put64(ret+8, math.Float64bits(m))
		}
	}
	return ret
}
