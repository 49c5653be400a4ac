// lsgd_batch_size.go: the `batch-size` interface for Go plugins; the plugin defines
// `func globalBatch(s *State) uint32`. The train-state arrives as its 16 flat core values.
package main

//go:wasmexport lsgd:policy/batch-size@0.1.0#global-batch
func exportGlobalBatch(step uint64, epoch uint32, epochFraction float64, stepsPerEpoch, totalSteps uint64,
	totalEpochs uint32, samplesSeen uint64, globalBatch_, workerBatch, worldSize uint32, baseLR float64,
	referenceBatch uint32, hasLoss uint32, loss float64, hasMetric uint32, metric float64) uint32 {
	ensureConfigured()
	s := State{step, epoch, epochFraction, stepsPerEpoch, totalSteps, totalEpochs, samplesSeen,
		globalBatch_, workerBatch, worldSize, baseLR, referenceBatch, hasLoss != 0, hasMetric != 0, loss, metric}
	return globalBatch(&s)
}
