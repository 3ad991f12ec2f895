package rdmacm

import (
	"encoding/binary"
	"fmt"
)

// RemoteBufferSize is the length of RemoteBuffer.Marshal's encoding.
const RemoteBufferSize = 16

// Marshal encodes the buffer (big-endian address, rkey, length) for the peer.
func (b RemoteBuffer) Marshal() []byte {
	out := make([]byte, RemoteBufferSize)
	binary.BigEndian.PutUint64(out, b.Addr)
	binary.BigEndian.PutUint32(out[8:], b.RKey)
	binary.BigEndian.PutUint32(out[12:], b.Len)
	return out
}

// ParseRemoteBuffer decodes what Marshal wrote.
func ParseRemoteBuffer(p []byte) (RemoteBuffer, error) {
	if len(p) < RemoteBufferSize {
		return RemoteBuffer{}, fmt.Errorf("rdmacm: remote buffer description is %d bytes, want %d", len(p), RemoteBufferSize)
	}
	return RemoteBuffer{Addr: binary.BigEndian.Uint64(p), RKey: binary.BigEndian.Uint32(p[8:]),
		Len: binary.BigEndian.Uint32(p[12:])}, nil
}

func (b RemoteBuffer) String() string {
	return fmt.Sprintf("%d bytes at %#x rkey %#x", b.Len, b.Addr, b.RKey)
}

// RemoteBuffer is a peer's registered memory as RDMA READ and WRITE address
// it. Exchange it with Marshal and ParseRemoteBuffer.
type RemoteBuffer struct {
	Addr uint64
	RKey uint32
	Len  uint32
}
