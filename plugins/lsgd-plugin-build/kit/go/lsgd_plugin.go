// lsgd_plugin.go: the lsgd:policy `plugin` interface for Go plugins (GOOS=wasip1, Go >= 1.24).
//
// Go has no component bindings generator for its standard toolchain, so this file is the
// canonical ABI of the contract's `describe` and `configure`, written out by hand: it lays the
// records out in linear memory exactly as wit-component expects (offsets from wit/v0.1.0, the
// same in every later 0.x version), exports `cabi_realloc` for the host to pass lists and
// strings in, and leaves a plugin three things to define: `info` (what describe returns),
// `configure(Params) error` and its kind's policy functions (lsgd_schedule.go and its siblings;
// lsgd_momentum.go adds 0.4's optional momentum to a schedule, lsgd_sync.go is 0.5's sync
// policy, lsgd_state.go the snapshot and restore of a stateful world).
// `lsgd-plugin-build componentize --wasi-stub` then wraps the core module into a component, with
// a stub in place of the wasip1 adapter that passes stderr (where Go prints a panic) to the host.
// The export names carry the contract version (`@0.1.0`, which the repository's Go plugins
// target); `lsgd-host new` and `lsgd-plugin-build go-kit` write these files with the version of
// the WIT they are for.
package main

import (
	"math"
	"strconv"
	"strings"
	"unsafe"
)

// Parameter and value kinds: the case indices of param-type and param-value.
const (
	KindBoolean uint8 = iota
	KindInteger
	KindFloat
	KindText
	KindFloatList
	KindChoice
)

// Value is a parameter value (WIT param-value); Kind says which field is meaningful.
type Value struct {
	Kind  uint8
	Bool  bool
	Int   int64
	Float float64
	Text  string
	List  []float64
}

// Spec is one accepted parameter (WIT param-spec); a nil Default makes it required.
type Spec struct {
	Name    string
	Kind    uint8
	Choices []string
	Default *Value
	Doc     string
}

// Info is what describe returns (WIT plugin-info).
type Info struct {
	Name, Version, Summary string
	Params                 []Spec
}

// Params are the resolved values of every declared parameter, by name.
type Params map[string]Value

// FloatParam declares a float parameter with a default.
func FloatParam(name string, def float64, doc string) Spec {
	return Spec{Name: name, Kind: KindFloat, Default: &Value{Kind: KindFloat, Float: def}, Doc: doc}
}

// IntegerParam declares an integer parameter with a default.
func IntegerParam(name string, def int64, doc string) Spec {
	return Spec{Name: name, Kind: KindInteger, Default: &Value{Kind: KindInteger, Int: def}, Doc: doc}
}

// FloatListParam declares a float-list parameter with a default.
func FloatListParam(name string, def []float64, doc string) Spec {
	return Spec{Name: name, Kind: KindFloatList, Default: &Value{Kind: KindFloatList, List: def}, Doc: doc}
}

// ChoiceParam declares a choice whose default is its first word.
func ChoiceParam(name string, words []string, doc string) Spec {
	return Spec{Name: name, Kind: KindChoice, Choices: words, Default: &Value{Kind: KindText, Text: words[0]}, Doc: doc}
}

// Error is a configure error: its text reaches the user unchanged.
type Error string

func (e Error) Error() string { return string(e) }

var kindNames = []string{"a boolean", "an integer", "a float", "text", "a list of floats"}

// Resolve overlays the host's values on the defaults of `info`: unknown names, wrong types,
// words outside a choice and missing required values are errors, as in lsgd_policy::Params.
func Resolve(info *Info, given []Value, names []string) (Params, error) {
	p := Params{}
	for _, s := range info.Params {
		if s.Default != nil {
			p[s.Name] = *s.Default
		}
	}
	for i, v := range given {
		var s *Spec
		for j := range info.Params {
			if info.Params[j].Name == names[i] {
				s = &info.Params[j]
			}
		}
		if s == nil {
			known := make([]string, len(info.Params))
			for j, s := range info.Params {
				known[j] = s.Name
			}
			list := strings.Join(known, ", ")
			if list == "" {
				list = "none"
			}
			return nil, Error("unknown parameter '" + names[i] + "' (accepted: " + list + ")")
		}
		want := s.Kind
		if want == KindChoice {
			want = KindText
		}
		if v.Kind != want {
			return nil, Error("parameter '" + s.Name + "' must be " + kindNames[want] + ", got " + kindNames[v.Kind])
		}
		if s.Kind == KindChoice {
			ok := false
			for _, w := range s.Choices {
				ok = ok || w == v.Text
			}
			if !ok {
				return nil, Error("parameter '" + s.Name + "' must be one of " + strings.Join(s.Choices, ", ") + ", got '" + v.Text + "'")
			}
		}
		p[s.Name] = v
	}
	for _, s := range info.Params {
		if _, ok := p[s.Name]; !ok {
			return nil, Error("missing required parameter '" + s.Name + "'")
		}
	}
	return p, nil
}

// Fmt prints v as Rust's `{}` prints an f64: shortest round-trip digits, never an exponent.
func Fmt(v float64) string {
	switch {
	case math.IsNaN(v):
		return "NaN"
	case math.IsInf(v, 1):
		return "inf"
	case math.IsInf(v, -1):
		return "-inf"
	}
	return strconv.FormatFloat(v, 'f', -1, 64)
}

// FloatAtLeast is a finite float parameter >= lo (lsgd_policy's float_at_least).
func FloatAtLeast(p Params, name string, lo float64) (float64, error) {
	v := p[name].Float
	if !(!math.IsInf(v, 0) && !math.IsNaN(v) && v >= lo) {
		return 0, Error(name + " must be >= " + Fmt(lo) + ", got " + Fmt(v))
	}
	return v, nil
}

// U32AtLeast is an integer parameter in [lo, 2^32-1] (lsgd_policy's u32_at_least).
func U32AtLeast(p Params, name string, lo uint32) (uint32, error) {
	v := p[name].Int
	if v < int64(lo) || v > math.MaxUint32 {
		return 0, Error(name + " must be in [" + strconv.FormatUint(uint64(lo), 10) + ", 4294967295], got " + strconv.FormatInt(v, 10))
	}
	return uint32(v), nil
}

// Milestones are finite, >= 0 and ascending epochs (lsgd_policy's milestones).
func Milestones(p Params, name string) ([]float64, error) {
	prev := 0.0
	for _, m := range p[name].List {
		if math.IsInf(m, 0) || math.IsNaN(m) || m < 0 {
			return nil, Error(name + " must all be >= 0, got " + Fmt(m))
		}
		if m < prev {
			return nil, Error(name + " must be ascending, got " + Fmt(m) + " after " + Fmt(prev))
		}
		prev = m
	}
	return append([]float64(nil), p[name].List...), nil
}

// Passed counts the milestones the fractional epoch e has reached (e >= m).
func Passed(ms []float64, e float64) int {
	n := 0
	for n < len(ms) && e >= ms[n] {
		n++
	}
	return n
}

// ---- the canonical ABI --------------------------------------------------------------------

// Buffers handed to the host or received from it; Go's collector does not move objects, so a
// reference here is enough to keep an address valid until the next export call.
var retained [][]byte

func alloc(size, align uint32) uint32 {
	buf := make([]byte, size+align)
	retained = append(retained, buf)
	p := uint32(uintptr(unsafe.Pointer(unsafe.SliceData(buf))))
	return (p + align - 1) &^ (align - 1)
}

func mem(ptr, n uint32) []byte {
	return unsafe.Slice((*byte)(unsafe.Pointer(uintptr(ptr))), n)
}

func put32(ptr, v uint32)        { *(*uint32)(unsafe.Pointer(uintptr(ptr))) = v }
func put64(ptr uint32, v uint64) { *(*uint64)(unsafe.Pointer(uintptr(ptr))) = v }
func put8(ptr uint32, v uint8)   { *(*uint8)(unsafe.Pointer(uintptr(ptr))) = v }
func get32(ptr uint32) uint32    { return *(*uint32)(unsafe.Pointer(uintptr(ptr))) }
func get64(ptr uint32) uint64    { return *(*uint64)(unsafe.Pointer(uintptr(ptr))) }
func get8(ptr uint32) uint8      { return *(*uint8)(unsafe.Pointer(uintptr(ptr))) }

// putString writes a string's (pointer, length) at ptr, the string's bytes in a retained copy.
func putString(ptr uint32, s string) {
	if len(s) == 0 {
		put32(ptr, 1)
		put32(ptr+4, 0)
		return
	}
	p := alloc(uint32(len(s)), 1)
	copy(mem(p, uint32(len(s))), s)
	put32(ptr, p)
	put32(ptr+4, uint32(len(s)))
}

func getString(ptr uint32) string {
	return string(mem(get32(ptr), get32(ptr+4)))
}

func getF64(ptr uint32) float64 { return math.Float64frombits(get64(ptr)) }

// getState reads a train-state record (120 bytes, alignment 8) at `at`, for the policy
// functions whose arguments arrive in linear memory (layer-rate's, sync's): the fields at their
// natural alignment, each option<f64> a flag byte with its payload 8 bytes on.
func getState(at uint32) State {
	return State{
		Step:           get64(at),
		Epoch:          get32(at + 8),
		EpochFraction:  getF64(at + 16),
		StepsPerEpoch:  get64(at + 24),
		TotalSteps:     get64(at + 32),
		TotalEpochs:    get32(at + 40),
		SamplesSeen:    get64(at + 48),
		GlobalBatch:    get32(at + 56),
		WorkerBatch:    get32(at + 60),
		WorldSize:      get32(at + 64),
		BaseLR:         getF64(at + 72),
		ReferenceBatch: get32(at + 80),
		HasLastLoss:    get8(at+88) != 0,
		LastLoss:       getF64(at + 96),
		HasLastMetric:  get8(at+104) != 0,
		LastMetric:     getF64(at + 112),
	}
}

//go:wasmexport cabi_realloc
func cabiRealloc(old, oldSize, align, newSize uint32) uint32 {
	p := alloc(newSize, align)
	if old != 0 {
		copy(mem(p, newSize), mem(old, min(oldSize, newSize)))
	}
	return p
}

// putValue writes a param-value (16 bytes: tag, payload at +8).
func putValue(at uint32, v *Value) {
	put8(at, v.Kind)
	switch v.Kind {
	case KindBoolean:
		if v.Bool {
			put8(at+8, 1)
		} else {
			put8(at+8, 0)
		}
	case KindInteger:
		put64(at+8, uint64(v.Int))
	case KindFloat:
		put64(at+8, math.Float64bits(v.Float))
	case KindText:
		putString(at+8, v.Text)
	case KindFloatList:
		p := alloc(uint32(8*len(v.List)), 8)
		for i, f := range v.List {
			put64(p+uint32(8*i), math.Float64bits(f))
		}
		put32(at+8, p)
		put32(at+12, uint32(len(v.List)))
	}
}

//go:wasmexport lsgd:policy/plugin@0.1.0#describe
func exportDescribe() uint32 {
	retained = nil
	ret := alloc(32, 8)
	putString(ret, info.Name)
	putString(ret+8, info.Version)
	putString(ret+16, info.Summary)
	// param-spec: name @0, type @8 (tag, choice list @12), default @24 (flag, value @32), doc @48.
	specs := alloc(uint32(56*len(info.Params)), 8)
	for i := range info.Params {
		s, at := &info.Params[i], specs+uint32(56*i)
		putString(at, s.Name)
		put8(at+8, s.Kind)
		if s.Kind == KindChoice {
			words := alloc(uint32(8*len(s.Choices)), 4)
			for j, w := range s.Choices {
				putString(words+uint32(8*j), w)
			}
			put32(at+12, words)
			put32(at+16, uint32(len(s.Choices)))
		}
		if s.Default != nil {
			put8(at+24, 1)
			putValue(at+32, s.Default)
		} else {
			put8(at+24, 0)
		}
		putString(at+48, s.Doc)
	}
	put32(ret+24, specs)
	put32(ret+28, uint32(len(info.Params)))
	return ret
}

// configured is false until configure succeeds; policy calls configure from the defaults
// first, so a fresh instance behaves as if configured with none.
var configured bool

func ensureConfigured() {
	if !configured {
		p, err := Resolve(&info, nil, nil)
		if err == nil {
			err = configure(p)
		}
		if err != nil {
			panic("policy cannot run on its defaults: " + err.Error())
		}
		configured = true
	}
}

//go:wasmexport lsgd:policy/plugin@0.1.0#configure
func exportConfigure(list, n uint32) uint32 {
	// param: name @0, value @8 (tag, payload @16); 24 bytes each.
	names, values := make([]string, n), make([]Value, n)
	for i := uint32(0); i < n; i++ {
		at := list + 24*i
		names[i] = getString(at)
		v := &values[i]
		v.Kind = get8(at + 8)
		switch v.Kind {
		case KindBoolean:
			v.Bool = get8(at+16) != 0
		case KindInteger:
			v.Int = int64(get64(at + 16))
		case KindFloat:
			v.Float = math.Float64frombits(get64(at + 16))
		case KindText:
			v.Text = getString(at + 16)
		case KindFloatList:
			p, m := get32(at+16), get32(at+20)
			v.List = make([]float64, m)
			for j := range v.List {
				v.List[j] = math.Float64frombits(get64(p + uint32(8*j)))
			}
		}
	}
	retained = nil
	p, err := Resolve(&info, values, names)
	if err == nil {
		err = configure(p)
	}
	ret := alloc(12, 4)
	if err != nil {
		put8(ret, 1)
		putString(ret+4, err.Error())
	} else {
		put8(ret, 0)
		configured = true
	}
	return ret
}

// State is the train-state of one step (WIT train-state); see docs/plugin-contract.md.
type State struct {
	Step           uint64
	Epoch          uint32
	EpochFraction  float64
	StepsPerEpoch  uint64
	TotalSteps     uint64
	TotalEpochs    uint32
	SamplesSeen    uint64
	GlobalBatch    uint32
	WorkerBatch    uint32
	WorldSize      uint32
	BaseLR         float64
	ReferenceBatch uint32
	// LastLoss and LastMetric are meaningful only when their Has flag is set.
	HasLastLoss, HasLastMetric bool
	LastLoss, LastMetric       float64
}

func main() {}
