package gateway

import (
	"errors"
	"fmt"

	"google.golang.org/protobuf/encoding/protowire"
	"google.golang.org/protobuf/proto"
	"google.golang.org/protobuf/reflect/protoreflect"
)

// MaxDecodedElements bounds what one message an agent sends may decode to: its messages, map
// entries and list elements, nested ones included. Decoding costs far more memory than the
// wire (an empty element takes 2 bytes on the wire and about 100 once decoded: a 16 MiB frame
// of empty acknowledgements decoded to 834 MiB), and an installed OS's agent is its lessee's
// program. The largest frame an agent makes holds 512 acknowledgements or updates, or a status
// report of at most 4 096 discovered machines and 256 withheld boots.
const MaxDecodedElements = 1 << 16

// errTooManyElements is a message over MaxDecodedElements.
var errTooManyElements = errors.New("the message decodes to too many elements")

// boundedProto is the gateway's protobuf codec (Connect's "proto"): a message is walked on the
// wire, and refused, before it is decoded when it would decode to more than limit elements.
type boundedProto struct{ limit int }

func (boundedProto) Name() string { return "proto" }

func (boundedProto) Marshal(m any) ([]byte, error) { return boundedProto{}.MarshalAppend(nil, m) }

// MarshalAppend lets Connect reuse its buffers, as its own codec does.
func (boundedProto) MarshalAppend(dst []byte, m any) ([]byte, error) {
	pm, ok := m.(proto.Message)
	if !ok {
		return nil, fmt.Errorf("%T is not a protobuf message", m)
	}
	return proto.MarshalOptions{}.MarshalAppend(dst, pm)
}

func (c boundedProto) Unmarshal(data []byte, m any) error {
	pm, ok := m.(proto.Message)
	if !ok {
		return fmt.Errorf("%T is not a protobuf message", m)
	}
	if _, err := decodedElements(data, pm.ProtoReflect().Descriptor(), c.limit, 0); err != nil {
		if errors.Is(err, errTooManyElements) {
			return fmt.Errorf("unmarshal into %T: %w: at most %d are accepted", m, err, c.limit)
		}
		return fmt.Errorf("unmarshal into %T: %w", m, err)
	}
	if err := proto.Unmarshal(data, pm); err != nil {
		return fmt.Errorf("unmarshal into %T: %w", m, err)
	}
	return nil
}

// maxDepth bounds the nesting decodedElements follows, as the protobuf decoder's own limit.
const maxDepth = 100

// decodedElements counts the elements b, a message of type md, decodes to: each message field
// (and map entry) once plus what it holds, each element of a list once. It stops, with
// errTooManyElements, once the count passes limit. Fields it does not know (unknown to md) are
// kept as bytes by the decoder and count for nothing. Pure.
func decodedElements(b []byte, md protoreflect.MessageDescriptor, limit, depth int) (int, error) {
	if depth > maxDepth {
		return 0, errors.New("messages nested too deep")
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
			k, err := decodedElements(inner, fd.Message(), limit-n-1, depth+1)
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
			return n, errTooManyElements
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

// noJSON stands for Connect's JSON codecs: agents speak binary protobuf, and JSON could not be
// bounded before it is decoded (boundedProto).
type noJSON struct{ name string }

func (c noJSON) Name() string { return c.name }

func (c noJSON) Marshal(any) ([]byte, error) { return nil, c.refused() }

func (c noJSON) Unmarshal([]byte, any) error { return c.refused() }

func (c noJSON) refused() error {
	return fmt.Errorf("the gateway does not speak %s: agents send binary protobuf (application/proto, application/grpc)", c.name)
}
