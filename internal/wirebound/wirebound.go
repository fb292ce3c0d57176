// Package wirebound bounds what one request may decode to before it is decoded. Decoding costs
// far more memory than the wire: an empty message in a list is 2 bytes of protobuf and about 100
// once decoded, an empty string 2 bytes and 16 plus its list's growth. So a request is counted on
// the wire (protobuf: Count; JSON: CountJSON) and refused, with an *ExceededError, when it would
// decode to more than a limit of elements: messages, map entries and list elements, nested ones
// included. The agent gateway and the API both decode through Proto; the API's JSON codec calls
// CountJSON first. Both answer with Gzip.
package wirebound

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// MaxDepth bounds the nesting the counters follow, as the protobuf decoder's own limit. No
// message of bcd's nests deeper than a few levels.
const MaxDepth = 100

// ExceededError is a message refused because it would decode to more than Limit elements. It
// says nothing of the message's content.
type ExceededError struct{ Limit int }

func (e *ExceededError) Error() string {
	return fmt.Sprintf("the message decodes to too many elements (messages, map entries and list elements): at most %d are accepted", e.Limit)
}

// TooDeepError is a message nested deeper than MaxDepth.
type TooDeepError struct{}

func (*TooDeepError) Error() string {
	return fmt.Sprintf("the message is nested too deep: at most %d levels are accepted", MaxDepth)
}

// Count counts the elements b, a protobuf message of type md, decodes to: each message field
// (and map entry) once plus what it holds, each element of a list once; the message itself is
// not counted. It stops with an *ExceededError once the count passes limit, and with an error
// on a message that is not valid protobuf. Fields unknown to md are kept as bytes by the
// decoder and count for nothing. Pure; it allocates only the error it returns.
func Count(b []byte, md protoreflect.MessageDescriptor, limit int) (int, error) {
	n, err := count(b, md, limit, 0)
	if err == nil {
		return n, nil
	}
	if exceeded := (*ExceededError)(nil); errors.As(err, &exceeded) {
		return n, &ExceededError{Limit: limit} // a nested call names what was left of limit
	}
	return n, err
}

func count(b []byte, md protoreflect.MessageDescriptor, limit, depth int) (int, error) {
	if depth > MaxDepth {
		return 0, &TooDeepError{}
	}
	n := 0
	fields := md.Fields()
	for len(b) > 0 {
		num, typ, tl := protowire.ConsumeTag(b)
		if tl < 0 {
			return n, protowire.ParseError(tl)
		}
		b = b[tl:]
		vl := protowire.ConsumeFieldValue(num, typ, b)
		if vl < 0 {
			return n, protowire.ParseError(vl)
		}
		fd := fields.ByNumber(num)
		switch {
		case fd == nil:
		case fd.Message() != nil && typ == protowire.BytesType:
			inner, _ := protowire.ConsumeBytes(b[:vl])
			k, err := count(inner, fd.Message(), limit-n-1, depth+1)
			n += 1 + k
			if err != nil {
				return n, err
			}
		case fd.IsList() && typ == protowire.BytesType && fd.Kind() != protoreflect.StringKind && fd.Kind() != protoreflect.BytesKind:
			n += packedElements(b[:vl], fd.Kind())
		case fd.IsList():
			n++
		}
		if n > limit {
			return n, &ExceededError{Limit: limit}
		}
		b = b[vl:]
	}
	return n, nil
}

// packedElements is the number of elements of a packed list of kind k (b its field, length
// prefix included). Pure.
func packedElements(b []byte, k protoreflect.Kind) int {
	v, _ := protowire.ConsumeBytes(b)
	switch k {
	case protoreflect.Fixed32Kind, protoreflect.Sfixed32Kind, protoreflect.FloatKind:
		return len(v) / 4
	case protoreflect.Fixed64Kind, protoreflect.Sfixed64Kind, protoreflect.DoubleKind:
		return len(v) / 8
	}
	n := 0 // varints: one ends at each byte below 0x80
	for _, c := range v {
		if c < 0x80 {
			n++
		}
	}
	return n
}

// CountJSON counts, without knowing the message's type, the elements the JSON text b may decode
// to: each object but the outermost (a message or a map), each object member (a field or a map
// entry) and each array element. That is never less than what protojson decodes it to (counted
// as Count does: a message's scalar fields are counted here and not there) for the messages of
// bcd, which use none of the well-known types whose JSON form is a string or a scalar
// (google.protobuf.FieldMask, Timestamp, Struct…). It stops with an *ExceededError once the
// count passes limit and with a *TooDeepError past MaxDepth levels; brackets, braces, commas
// and colons inside strings count for nothing. Anything else that is not JSON is left to the
// decoder. Pure; it allocates only the error it returns.
func CountJSON(b []byte, limit int) (int, error) {
	var inArray [MaxDepth + 1]bool // what each open level is: an array or an object
	depth, n := 0, 0
	for i := 0; i < len(b); i++ {
		switch b[i] {
		case '"':
			for i++; i < len(b) && b[i] != '"'; i++ {
				if b[i] == '\\' {
					i++
				}
			}
			continue
		case '{', '[':
			if depth == len(inArray) {
				return n, &TooDeepError{}
			}
			if b[i] == '{' && depth > 0 {
				n++
			}
			inArray[depth] = b[i] == '['
			depth++
			if b[i] == '[' && !emptyArray(b[i+1:]) {
				n++
			}
		case '}', ']':
			if depth > 0 {
				depth--
			}
			continue
		case ':':
			n++
		case ',':
			if depth > 0 && inArray[depth-1] {
				n++
			}
		default:
			continue
		}
		if n > limit {
			return n, &ExceededError{Limit: limit}
		}
	}
	return n, nil
}

// emptyArray tells whether the JSON text after an array's '[' closes it at once.
func emptyArray(b []byte) bool {
	for _, c := range b {
		switch c {
		case ' ', '\t', '\n', '\r':
		case ']':
			return true
		default:
			return false
		}
	}
	return true
}

// Proto is a protobuf codec (Connect's "proto") that walks a message on the wire, and refuses
// it, before decoding it when it would decode to more than its limit of elements.
type Proto struct{ limit int }

// NewProto is the protobuf codec that decodes messages of at most limit elements.
func NewProto(limit int) Proto { return Proto{limit: limit} }

// Name is Connect's name of the protobuf codec, which Proto replaces.
func (Proto) Name() string { return "proto" }

// Marshal encodes m as protobuf does.
func (c Proto) Marshal(m any) ([]byte, error) { return c.MarshalAppend(nil, m) }

// MarshalAppend lets Connect reuse its buffers, as its own codec does.
func (Proto) MarshalAppend(dst []byte, m any) ([]byte, error) {
	pm, ok := m.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("%T is not a protobuf message", m)
	}
	return proto.MarshalOptions{}.MarshalAppend(dst, pm)
}

// Unmarshal decodes data into m when it decodes to at most the codec's limit of elements.
func (c Proto) Unmarshal(data []byte, m any) error {
	pm, ok := m.(proto.Message)
	if !ok {
		return fmt.Errorf("%T is not a protobuf message", m)
	}
	if _, err := Count(data, pm.ProtoReflect().Descriptor(), c.limit); err != nil {
		return fmt.Errorf("unmarshal into %T: %w", m, err)
	}
	if err := proto.Unmarshal(data, pm); err != nil {
		return fmt.Errorf("unmarshal into %T: %w", m, err)
	}
	return nil
}
