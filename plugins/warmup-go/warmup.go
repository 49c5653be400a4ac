// warmup in Go: Goyal et al.'s schedule (linear scaling, gradual warmup, step decay).
//
// The arithmetic is plugins/lsgd-policy/src/warmup.rs and lr.rs in the same order, so
// `lsgd-host compare warmup warmup-go.wasm` finds it bit-identical. (Go may fuse x*y+z into an
// FMA on some CPUs; wasm has no FMA instruction, so on GOARCH=wasm every operation rounds.)
package main

import "math"

var info = Info{
	Name:    "warmup",
	Version: "1.0.0",
	Summary: "Goyal et al.: LR scaling, gradual warmup, then step decay at milestones",
	Params: []Spec{
		ChoiceParam("scaling", []string{"linear", "sqrt", "none"},
			"target LR from base_lr: linear (x B/B_ref), sqrt (x sqrt(B/B_ref)) or none"),
		ChoiceParam("warmup", []string{"gradual", "constant", "none"},
			"warmup shape: gradual (eta/k rising to eta), constant (eta/k) or none"),
		FloatParam("warmup_epochs", 5.0, "warmup length W in epochs"),
		FloatListParam("milestones", []float64{30, 60, 80},
			"epochs at which the LR is multiplied by gamma (ascending)"),
		FloatParam("gamma", 0.1, "decay factor applied at each milestone"),
	},
}

var cfg struct {
	scaling, shape string
	epochs, gamma  float64
	milestones     []float64
}

// configure makes the checks of Warmup::configure, in its order.
func configure(p Params) error {
	shape := p["warmup"].Text
	if shape != "gradual" && shape != "constant" && shape != "none" {
		return Error("warmup must be gradual, constant or none, got '" + shape + "'")
	}
	epochs, err := FloatAtLeast(p, "warmup_epochs", 0)
	if err != nil {
		return err
	}
	scaling := p["scaling"].Text
	if scaling != "linear" && scaling != "sqrt" && scaling != "none" {
		return Error("scaling must be linear, sqrt or none, got '" + scaling + "'")
	}
	milestones, err := Milestones(p, "milestones")
	if err != nil {
		return err
	}
	gamma, err := FloatAtLeast(p, "gamma", 0)
	if err != nil {
		return err
	}
	if shape == "none" {
		epochs = 0
	}
	cfg.scaling, cfg.shape, cfg.epochs, cfg.gamma, cfg.milestones = scaling, shape, epochs, gamma, milestones
	return nil
}

func learningRate(s *State) float64 {
	r := 1.0
	if s.ReferenceBatch != 0 {
		r = float64(s.GlobalBatch) / float64(s.ReferenceBatch)
	}
	eta := s.BaseLR
	switch cfg.scaling {
	case "linear":
		eta = s.BaseLR * r
	case "sqrt":
		eta = s.BaseLR * math.Sqrt(r)
	}
	e, w := s.EpochFraction, cfg.epochs
	if e < w && cfg.shape != "none" {
		k := 1.0
		if r > 1 {
			k = r
		}
		if cfg.shape == "gradual" {
			return eta * (1.0 / k) * (1.0 + (k-1.0)*e/w)
		}
		return eta / k
	}
	// Repeated multiplication, not math.Pow: pow's rounding differs between libraries.
	lr := eta
	for i := Passed(cfg.milestones, e); i > 0; i-- {
		lr *= cfg.gamma
	}
	return lr
}
