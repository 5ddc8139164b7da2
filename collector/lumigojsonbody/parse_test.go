package lumigojsonbody

import (
	"fmt"
	"regexp"
	"strings"
	"testing"

	"github.com/goccy/go-json"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/plog"
)

// The agent's former operator: `json_parser` with `if: body matches "^\\s*\\{"`,
// `on_error: send_quiet` (goccy/go-json into a Go map; stanza converts it into the body).
var gate = regexp.MustCompile(`^\s*\{`)

func jsonParserBody(text string) pcommon.Value {
	v := pcommon.NewValueStr(text)
	var raw map[string]any
	if gate.MatchString(text) && json.Unmarshal([]byte(text), &raw) == nil {
		if err := v.SetEmptyMap().FromRaw(raw); err != nil {
			panic(err)
		}
	}
	return v
}

func body(text string) pcommon.Value {
	record := plog.NewLogRecord()
	record.Body().SetStr(text)
	SetMapBody(record)
	return record.Body()
}

func fast(text string) bool {
	p := parser{s: text}
	p.space()
	err := p.object(pcommon.NewMap(), 0)
	p.space()
	return err == nil && p.i == len(p.s)
}

var cases = []string{
	`{"level":"info","msg":"request served","path":"/api/items","status":200,"seq":7}`,
	`  {"a": 1}`, "\f\t\n\r {\"a\":1}", "{\"a\":1}\n", `{}`, ` { } `, `{"a":{}}`, `{"a":[]}`,
	`{"n":-0}`, `{"n":-0.0}`, `{"n":1e2}`, `{"n":1E+2}`, `{"n":1.5e-3}`, `{"n":12345678901234567890}`,
	`{"n":9007199254740993}`, `{"n":1e400}`, `{"n":-1e400}`, `{"n":1e-400}`, `{"n":01}`, `{"n":1.}`,
	`{"n":.5}`, `{"n":-}`, `{"n":+1}`, `{"n":0x10}`, `{"n":1_0}`, `{"n":NaN}`, `{"n":Infinity}`,
	`{"b":true,"c":false,"d":null}`, `{"b":tru}`, `{"b":True}`, `{"d":nul}`, `{"d":nullx}`,
	`{"a":1,"a":2}`, `{"a":{"x":1},"a":{"y":2}}`, `{"a":[1,{"b":[null,"x",true]}]}`,
	`{"s":"\"\\\/\b\f\n\r\t"}`, `{"s":"\u0041\u00e9\u4e2d\u0000"}`, `{"s":"\ud83d\ude00"}`,
	`{"s":"\ud83d"}`, `{"s":"\ude00x"}`, `{"s":"\u12"}`, `{"s":"\u12G4"}`, `{"s":"\x"}`,
	`{"s":"é中😀"}`, "{\"s\":\"\xff\"}", "{\"s\":\"a\xc3\"}", "{\"\xff\":1}", "{\"s\":\"\\n\xff\"}",
	"{\"s\":\"tab\there\"}", "{\"s\":\"nul\x00\"}", "{\"a\":1}\x00", "{\"a\":1\x00}", "{\"a\":\x001}",
	`{"a":1} x`, `{"a":1}}`, `{"a":1},`, `{"a":1`, `{"a"`, `{"a":}`, `{a:1}`, `{'a':1}`, `{"a":1,}`,
	`{,"a":1}`, `{"a":1 "b":2}`, `{"a":[1,]}`, `{"a":[,1]}`, `{"a":[1 2]}`, `{"a":"x}`, `{"a":"x\`,
	`{"a":1}{"b":2}`, "{\"a\":1}\v", "\v{\"a\":1}", "{\"a\" \t:\n1 ,\r\"b\":2}", `{"":1}`,
	`{"a":"` + strings.Repeat("y", 600_000) + `"}`,
	strings.Repeat(`{"a":`, 63) + "1" + strings.Repeat("}", 63),
	strings.Repeat(`{"a":`, 64) + "1" + strings.Repeat("}", 64),
	strings.Repeat(`{"a":`, 10_001) + "1" + strings.Repeat("}", 10_001),
	strings.Repeat(`{"a":`, 150_000) + `"x"` + strings.Repeat("}", 150_000),
	`{"a":` + strings.Repeat("[", 70) + strings.Repeat("]", 70) + `}`,
	"plain text", "", "   ", "[1,2]", "null", "42", `"s"`, "{", "{looks like an object but is not",
	wide(64), wide(65), wide(5_000), `{"a":` + wide(65) + `}`, `{"a":1,"b":2,"a":3}`,
}

// An object of n distinct members (pcommon.Map.Equal takes quadratic time: a few thousand).
func wide(n int) string {
	members := make([]string, n)
	for i := range members {
		members[i] = fmt.Sprintf(`"k%d":%d`, i, i)
	}
	return "{" + strings.Join(members, ",") + "}"
}

// Every body is what the json_parser made of it: the same map, or the same string.
func TestSameBodiesAsTheJSONParser(t *testing.T) {
	for _, text := range cases {
		want, got := jsonParserBody(text), body(text)
		if !want.Equal(got) {
			t.Errorf("%.80q: json_parser %.200v, here %.200v", text, want.AsRaw(), got.AsRaw())
		}
	}
}

// The fast path takes ordinary application lines (nothing left to goccy/go-json).
func TestOrdinaryLinesTakeTheFastPath(t *testing.T) {
	for _, text := range []string{
		cases[0], `{"msg":"caf\u00e9 \"quoted\"\n","ts":1.7e9,"tags":["a","b"],"ok":true,"err":null}`,
		`{"s":"é中😀","nested":{"a":{"b":[1,2,{"c":-3.25}]}}}`,
	} {
		if !fast(text) {
			t.Errorf("%q left the fast path", text)
		}
	}
}

// Past 64 members an object leaves the fast path, whose look-up of each new key among the others
// would make a line of 100,000 keys take minutes (the fallback takes a fraction of a second).
func TestWideObjectsLeaveTheFastPath(t *testing.T) {
	if !fast(wide(64)) || fast(wide(65)) || fast(`{"a":`+wide(65)+`}`) {
		t.Fatal("the fast path takes objects of 64 members at most")
	}
}

func TestOtherBodiesAreLeftAlone(t *testing.T) {
	record := plog.NewLogRecord()
	record.Body().SetEmptyMap().PutStr("k", `{"a":1}`)
	SetMapBody(record)
	if record.Body().Type() != pcommon.ValueTypeMap || record.Body().Map().Len() != 1 {
		t.Fatalf("a map body changed: %v", record.Body().AsRaw())
	}
}

func FuzzSameBodiesAsTheJSONParser(f *testing.F) {
	for _, text := range cases {
		if len(text) < 1000 {
			f.Add(text)
		}
	}
	f.Fuzz(func(t *testing.T, text string) {
		want, got := jsonParserBody(text), body(text)
		if !want.Equal(got) {
			t.Errorf("%q: json_parser %v, here %v", text, want.AsRaw(), got.AsRaw())
		}
	})
}

func BenchmarkJSONLine(b *testing.B) {
	for b.Loop() {
		body(cases[0])
	}
}

func BenchmarkJSONLineAsTheJSONParser(b *testing.B) {
	for b.Loop() {
		jsonParserBody(cases[0])
	}
}
