package msg

import (
	"encoding/binary"
	"fmt"
)

// Version is the version of the frame header and the hello that this
// package speaks. A peer announcing another version is refused.
const Version = 1

// HeaderSize is the length of the header in front of every frame.
const HeaderSize = 12

// frameMagic is the first byte of every frame: garbage rarely starts with it.
const frameMagic = 0x6d // 'm'

// frameType says what a frame carries.
type frameType uint8

const (
	// frameHello is the dialer's first frame: it tells the accepting side
	// that the connection is up on both ends (on iWARP the dialer must send
	// first), and consumes one credit.
	frameHello frameType = 1
	// frameData carries one message and consumes one credit.
	frameData frameType = 2
	// frameCredit carries only the header's grant; it consumes no credit
	// but one reply slot (flagSlot) the peer gave.
	frameCredit frameType = 3
	// frameFin says the sender will send no more messages; it consumes one
	// credit.
	frameFin frameType = 4
)

func (t frameType) String() string {
	switch t {
	case frameHello:
		return "HELLO"
	case frameData:
		return "DATA"
	case frameCredit:
		return "CREDIT"
	case frameFin:
		return "FIN"
	}
	return fmt.Sprintf("type %d", uint8(t))
}

// usesCredit reports whether a frame of this type takes one of the
// receive buffers the credits count (and is given back by a release).
func (t frameType) usesCredit() bool { return t != frameCredit }

// flagSlot on a frame gives its receiver one reply slot: the right to send
// one CREDIT frame back. The sender keeps a receive buffer posted for it.
const flagSlot = 1 << 0

// header is the frame header, big-endian on the wire:
//
//	byte 0      magic 0x6d
//	byte 1      version (1)
//	byte 2      type: 1 HELLO, 2 DATA, 3 CREDIT, 4 FIN
//	byte 3      flags: bit 0 gives the receiver a reply slot; others zero
//	bytes 4-7   grant: how many credit-using frames the sender of this
//	            header lets its peer send in all, since the connection
//	            began (a counter that wraps)
//	bytes 8-11  length of the payload that follows
type header struct {
	typ    frameType
	flags  uint8
	grant  uint32
	length uint32
}

func (h header) put(b []byte) {
	_ = b[HeaderSize-1]
	b[0] = frameMagic
	b[1] = Version
	b[2] = byte(h.typ)
	b[3] = h.flags
	binary.BigEndian.PutUint32(b[4:], h.grant)
	binary.BigEndian.PutUint32(b[8:], h.length)
}

// decodeFrame parses and checks the frame in b (what a receive completion
// delivered): the header, then that the payload is exactly what the header
// says and fits max. Its errors say what the peer sent.
func decodeFrame(b []byte, max int) (header, []byte, error) {
	if len(b) < HeaderSize {
		return header{}, nil, fmt.Errorf("a %d-byte frame, shorter than the %d-byte header", len(b), HeaderSize)
	}
	if b[0] != frameMagic {
		return header{}, nil, fmt.Errorf("a frame that does not start with the magic byte 0x%02x (got 0x%02x): not this protocol, or garbage", frameMagic, b[0])
	}
	if b[1] != Version {
		return header{}, nil, fmt.Errorf("a frame of version %d (this side speaks %d)", b[1], Version)
	}
	h := header{typ: frameType(b[2]), flags: b[3], grant: binary.BigEndian.Uint32(b[4:]), length: binary.BigEndian.Uint32(b[8:])}
	switch h.typ {
	case frameHello, frameData, frameCredit, frameFin:
	default:
		return header{}, nil, fmt.Errorf("a frame of unknown %v", h.typ)
	}
	if h.flags&^flagSlot != 0 {
		return header{}, nil, fmt.Errorf("a %v frame with unknown flags 0x%02x", h.typ, h.flags)
	}
	payload := b[HeaderSize:]
	if uint64(h.length) != uint64(len(payload)) {
		return header{}, nil, fmt.Errorf("a %v frame whose header says %d bytes of payload, with %d", h.typ, h.length, len(payload))
	}
	if h.typ != frameData && h.length != 0 {
		return header{}, nil, fmt.Errorf("a %v frame with %d bytes of payload (it carries none)", h.typ, h.length)
	}
	if len(payload) > max {
		return header{}, nil, fmt.Errorf("a %d-byte message, larger than the %d bytes agreed in the hello", len(payload), max)
	}
	return h, payload, nil
}

// helloSize is the length of the hello each side puts in the CM's private
// data (the connect request's and the accept's): it fits the 52 bytes a
// RoCE connect request leaves after rdmago's private data header.
const helloSize = 16

// helloMagic starts the hello.
var helloMagic = [4]byte{'r', 'm', 's', 'g'}

// hello states what its sender can take:
//
//	bytes 0-3    "rmsg"
//	byte 4       version (1)
//	byte 5       flags, zero
//	bytes 6-7    reply slots: receive buffers kept for CREDIT frames
//	bytes 8-11   credits: receive buffers for messages, the peer's
//	             initial grant
//	bytes 12-15  the largest message it receives
//
// and, from a sender that takes keepalive probes (every rdmago since they
// read memory), the memory they read:
//
//	bytes 16-19  its key
//	bytes 20-27  its address
type hello struct {
	version    uint8
	replySlots uint16
	credits    uint32
	maxMessage uint32
	// probe: the hello names the memory keepalive probes read (probeKey,
	// probeAddr); a peer without it takes only zero-length ones.
	probe     bool
	probeKey  uint32
	probeAddr uint64
}

// helloProbeSize is the length of a hello that names the probes' memory.
const helloProbeSize = helloSize + 12

func (h hello) marshal() []byte {
	b := make([]byte, helloSize)
	copy(b, helloMagic[:])
	b[4] = h.version
	binary.BigEndian.PutUint16(b[6:], h.replySlots)
	binary.BigEndian.PutUint32(b[8:], h.credits)
	binary.BigEndian.PutUint32(b[12:], h.maxMessage)
	return b
}

// marshalProbe is marshal with room for the probes' memory, which
// putProbe fills in once it is registered.
func (h hello) marshalProbe() []byte {
	b := make([]byte, helloProbeSize)
	copy(b, h.marshal())
	return b
}

// putProbe writes the key and address of the probes' memory into a hello
// from marshalProbe.
func putProbe(b []byte, key uint32, addr uint64) {
	binary.BigEndian.PutUint32(b[helloSize:], key)
	binary.BigEndian.PutUint64(b[helloSize+4:], addr)
}

// Bounds of what a hello may announce.
const (
	maxCredits    = 1 << 16
	maxReplySlots = 64
	maxMessageCap = 1 << 30
)

// parseHello reads and checks a peer's hello. Extra bytes after it are
// ignored (a later version may add fields).
func parseHello(b []byte) (hello, error) {
	if len(b) < helloSize || [4]byte(b[:4]) != helloMagic {
		return hello{}, fmt.Errorf("no rdmago message hello in the %d bytes of private data (not an rdmago/msg peer?)", len(b))
	}
	h := hello{version: b[4], replySlots: binary.BigEndian.Uint16(b[6:]), credits: binary.BigEndian.Uint32(b[8:]),
		maxMessage: binary.BigEndian.Uint32(b[12:])}
	if len(b) >= helloProbeSize {
		h.probe, h.probeKey, h.probeAddr = true, binary.BigEndian.Uint32(b[helloSize:]), binary.BigEndian.Uint64(b[helloSize+4:])
	}
	switch {
	case h.version != Version:
		return h, fmt.Errorf("the peer speaks version %d of the message protocol, this side %d", h.version, Version)
	case b[5] != 0:
		return h, fmt.Errorf("hello with unknown flags 0x%02x", b[5])
	case h.credits < 2 || h.credits > maxCredits:
		// One buffer is kept for FIN: fewer than two leave none for a
		// message.
		return h, fmt.Errorf("hello announcing %d credits (2 to %d allowed: one is kept for the end of the stream)", h.credits, maxCredits)
	case h.replySlots < 1 || h.replySlots > maxReplySlots:
		return h, fmt.Errorf("hello announcing %d reply slots (1 to %d allowed)", h.replySlots, maxReplySlots)
	case h.maxMessage < 1 || h.maxMessage > maxMessageCap:
		return h, fmt.Errorf("hello announcing a %d-byte maximum message (1 to %d allowed)", h.maxMessage, maxMessageCap)
	}
	return h, nil
}
