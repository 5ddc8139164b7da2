package lumigojsonbody

import (
	"errors"
	"strconv"
	"unicode/utf8"

	"github.com/goccy/go-json"
	"go.opentelemetry.io/collector/pdata/pcommon"
	"go.opentelemetry.io/collector/pdata/plog"
)

// Nesting deeper than this leaves the fast path; goccy/go-json then decides (it refuses more
// than 10,000 levels), as it does for anything else the fast path does not take.
const fastDepth = 64

// An object with more members leaves the fast path: each new member is looked for among the
// others (a repeated key replaces its value), so a hostile line of 100,000 keys would take minutes;
// the fallback builds its map from a Go map, in linear time.
const fastMembers = 64

// How far members looks ahead.
const lookahead = 1024

// errFallback: the fast path does not take this input (invalid, or an unusual form whose exact
// handling is goccy/go-json's): the record is parsed the way stanza's json_parser parses it.
var errFallback = errors.New("not on the fast path")

// SetMapBody replaces a string body that is a JSON object (after RE2 `\s` whitespace, as the
// json_parser's `body matches "^\\s*\\{"` gate) by its map; any other body is left unchanged.
func SetMapBody(record plog.LogRecord) {
	body := record.Body()
	if body.Type() != pcommon.ValueTypeStr {
		return
	}
	text := body.Str()
	if !looksLikeObject(text) {
		return
	}
	parsed := pcommon.NewMap()
	p := parser{s: text}
	p.space()
	if err := p.object(parsed, 0); err == nil {
		if p.space(); p.i == len(p.s) {
			parsed.MoveTo(body.SetEmptyMap())
			return
		}
	}
	// The json_parser's own parse: goccy/go-json into Go values, then into the map.
	var raw map[string]any
	if json.Unmarshal([]byte(text), &raw) != nil || raw == nil {
		return
	}
	m := pcommon.NewMap()
	if m.FromRaw(raw) == nil {
		m.MoveTo(body.SetEmptyMap())
	}
}

func looksLikeObject(s string) bool {
	for i := 0; i < len(s); i++ {
		switch s[i] {
		case ' ', '\t', '\n', '\f', '\r':
		case '{':
			return true
		default:
			return false
		}
	}
	return false
}

// parser reads strict JSON (RFC 8259) from s straight into pcommon values. Strings without
// escapes share s's memory.
type parser struct {
	s string
	i int
}

func (p *parser) space() {
	for p.i < len(p.s) {
		switch p.s[p.i] {
		case ' ', '\t', '\n', '\r':
			p.i++
		default:
			return
		}
	}
}

// object reads `{...}` at p.i into m (empty); a repeated key keeps its last value, as in a Go map.
func (p *parser) object(m pcommon.Map, depth int) error {
	if depth >= fastDepth || p.i >= len(p.s) || p.s[p.i] != '{' {
		return errFallback
	}
	p.i++
	p.space()
	if p.i < len(p.s) && p.s[p.i] == '}' {
		p.i++
		return nil
	}
	m.EnsureCapacity(p.members())
	for n := 1; ; n++ {
		if n > fastMembers {
			return errFallback
		}
		p.space()
		key, err := p.str()
		if err != nil {
			return err
		}
		p.space()
		if p.i >= len(p.s) || p.s[p.i] != ':' {
			return errFallback
		}
		p.i++
		p.space()
		if err := p.value(m.PutEmpty(key), depth); err != nil {
			return err
		}
		if last, err := p.after('}'); last || err != nil {
			return err
		}
	}
}

// after reads what follows a member or an element: a comma (false) or the closing bracket (true).
func (p *parser) after(closing byte) (bool, error) {
	p.space()
	if p.i < len(p.s) && (p.s[p.i] == ',' || p.s[p.i] == closing) {
		p.i++
		return p.s[p.i-1] == closing, nil
	}
	return false, errFallback
}

// members guesses the number of members of the object at p.i from the commas outside strings
// and nested values in its first bytes (a map that grows one member at a time is reallocated
// each time it is full).
func (p *parser) members() int {
	n, nested, quoted := 1, 0, false
	for i := p.i; i < len(p.s) && i < p.i+lookahead; i++ {
		switch c := p.s[i]; {
		case quoted:
			if c == '\\' {
				i++
			} else if c == '"' {
				quoted = false
			}
		case c == '"':
			quoted = true
		case c == '{' || c == '[':
			nested++
		case c == '}' || c == ']':
			if nested == 0 {
				return n
			}
			nested--
		case c == ',' && nested == 0:
			n++
		}
	}
	return n
}

func (p *parser) array(sl pcommon.Slice, depth int) error {
	if depth >= fastDepth {
		return errFallback
	}
	p.i++ // '['
	p.space()
	if p.i < len(p.s) && p.s[p.i] == ']' {
		p.i++
		return nil
	}
	for {
		p.space()
		if err := p.value(sl.AppendEmpty(), depth); err != nil {
			return err
		}
		if last, err := p.after(']'); last || err != nil {
			return err
		}
	}
}

// value reads one JSON value at p.i into v (empty): a number is a double, null stays empty.
func (p *parser) value(v pcommon.Value, depth int) error {
	if p.i >= len(p.s) {
		return errFallback
	}
	switch c := p.s[p.i]; {
	case c == '{':
		return p.object(v.SetEmptyMap(), depth+1)
	case c == '[':
		return p.array(v.SetEmptySlice(), depth+1)
	case c == '"':
		s, err := p.str()
		if err == nil {
			v.SetStr(s)
		}
		return err
	case c == '-' || ('0' <= c && c <= '9'):
		f, err := p.number()
		if err == nil {
			v.SetDouble(f)
		}
		return err
	default:
		for _, literal := range [...]string{"true", "false", "null"} {
			if len(p.s)-p.i >= len(literal) && p.s[p.i:p.i+len(literal)] == literal {
				p.i += len(literal)
				if literal != "null" {
					v.SetBool(literal == "true")
				}
				return nil
			}
		}
		return errFallback
	}
}

// number reads a number of JSON's grammar; one strconv cannot represent leaves the fast path.
func (p *parser) number() (float64, error) {
	start := p.i
	if p.s[p.i] == '-' {
		p.i++
	}
	switch {
	case p.i < len(p.s) && p.s[p.i] == '0':
		p.i++
	case p.i < len(p.s) && '1' <= p.s[p.i] && p.s[p.i] <= '9':
		p.digits()
	default:
		return 0, errFallback
	}
	if p.i < len(p.s) && p.s[p.i] == '.' {
		p.i++
		if p.digits() == 0 {
			return 0, errFallback
		}
	}
	if p.i < len(p.s) && (p.s[p.i] == 'e' || p.s[p.i] == 'E') {
		p.i++
		if p.i < len(p.s) && (p.s[p.i] == '+' || p.s[p.i] == '-') {
			p.i++
		}
		if p.digits() == 0 {
			return 0, errFallback
		}
	}
	f, err := strconv.ParseFloat(p.s[start:p.i], 64)
	if err != nil {
		return 0, errFallback
	}
	return f, nil
}

func (p *parser) digits() int {
	start := p.i
	for p.i < len(p.s) && '0' <= p.s[p.i] && p.s[p.i] <= '9' {
		p.i++
	}
	return p.i - start
}

// str reads a string at p.i: valid UTF-8, no control character, the escapes of JSON except
// UTF-16 surrogates (those leave the fast path).
func (p *parser) str() (string, error) {
	if p.i >= len(p.s) || p.s[p.i] != '"' {
		return "", errFallback
	}
	p.i++
	start, ascii := p.i, true
	for p.i < len(p.s) {
		c := p.s[p.i]
		switch {
		case c == '"':
			s := p.s[start:p.i]
			p.i++
			if !ascii && !utf8.ValidString(s) {
				return "", errFallback
			}
			return s, nil
		case c == '\\':
			return p.escaped(start)
		case c < 0x20:
			return "", errFallback
		case c >= 0x80:
			ascii = false
		}
		p.i++
	}
	return "", errFallback
}

// escaped reads the rest of a string that has escapes, from its start.
func (p *parser) escaped(start int) (string, error) {
	out := make([]byte, 0, p.i-start+16)
	out = append(out, p.s[start:p.i]...)
	for p.i < len(p.s) {
		c := p.s[p.i]
		switch {
		case c == '"':
			p.i++
			if !utf8.Valid(out) {
				return "", errFallback
			}
			return string(out), nil
		case c < 0x20:
			return "", errFallback
		case c != '\\':
			out = append(out, c)
			p.i++
			continue
		}
		if p.i+1 >= len(p.s) {
			return "", errFallback
		}
		p.i += 2
		switch e := p.s[p.i-1]; e {
		case '"', '\\', '/':
			out = append(out, e)
		case 'b':
			out = append(out, '\b')
		case 'f':
			out = append(out, '\f')
		case 'n':
			out = append(out, '\n')
		case 'r':
			out = append(out, '\r')
		case 't':
			out = append(out, '\t')
		case 'u':
			if p.i+4 > len(p.s) {
				return "", errFallback
			}
			r, err := strconv.ParseUint(p.s[p.i:p.i+4], 16, 32)
			if err != nil || (0xD800 <= r && r <= 0xDFFF) {
				return "", errFallback
			}
			p.i += 4
			out = utf8.AppendRune(out, rune(r))
		default:
			return "", errFallback
		}
	}
	return "", errFallback
}
