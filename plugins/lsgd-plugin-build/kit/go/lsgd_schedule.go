// lsgd_schedule.go: the `schedule` interface for Go plugins; the plugin defines
// `func learningRate(s *State) float64`. The train-state arrives as its 16 flat core values.
package main

//go:wasmexport lsgd:policy/schedule@0.1.0#learning-rate
func exportLearningRate(step uint64, epoch uint32, epochFraction float64, stepsPerEpoch, totalSteps uint64,
	totalEpochs uint32, samplesSeen uint64, globalBatch, workerBatch, worldSize uint32, baseLR float64,
	referenceBatch uint32, hasLoss uint32, loss float64, hasMetric uint32, metric float64) float64 {
	ensureConfigured()
	s := State{step, epoch, epochFraction, stepsPerEpoch, totalSteps, totalEpochs, samplesSeen,
		globalBatch, workerBatch, worldSize, baseLR, referenceBatch, hasLoss != 0, hasMetric != 0, loss, metric}
	return learningRate(&s)
}
