"""pcapio - read classic pcap / pcapng records and write classic pcap (python stdlib only)."""
import struct

LINKTYPE_ETHERNET = 1

_PCAP_MAGICS = {
    b"\xd4\xc3\xb2\xa1": ("<", 1e-6), b"\x4d\x3c\xb2\xa1": ("<", 1e-9),
    b"\xa1\xb2\xc3\xd4": (">", 1e-6), b"\xa1\xb2\x3c\x4d": (">", 1e-9),
}


class Record:
    """One captured frame: its number (1-based, capture order), time, link type and bytes."""
    __slots__ = ("num", "ts", "linktype", "data")

    def __init__(self, num, ts, linktype, data):
        self.num, self.ts, self.linktype, self.data = num, ts, linktype, data


def read_records(path):
    """All frames of a classic pcap or pcapng file (any byte order), in capture order.

    A truncated last record (a file still being written) ends the list."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 24:
        return []
    magic = data[:4]
    if magic in _PCAP_MAGICS:
        return _read_pcap(data, *_PCAP_MAGICS[magic])
    if magic == b"\x0a\x0d\x0d\x0a":
        return _read_pcapng(data)
    return []


def _read_pcap(data, e, unit):
    linktype = struct.unpack(e + "I", data[20:24])[0] & 0x0FFFFFFF
    out, off = [], 24
    while off + 16 <= len(data):
        sec, frac, incl, _ = struct.unpack(e + "IIII", data[off:off + 16])
        if off + 16 + incl > len(data):
            break
        out.append(Record(len(out) + 1, sec + frac * unit, linktype, data[off + 16:off + 16 + incl]))
        off += 16 + incl
    return out


def _read_pcapng(data):
    out, off, e = [], 0, "<"
    ifaces = []          # per section: (linktype, seconds per timestamp unit)
    while off + 12 <= len(data):
        if data[off:off + 4] == b"\x0a\x0d\x0d\x0a":
            e = "<" if data[off + 8:off + 12] == b"\x4d\x3c\x2b\x1a" else ">"
            ifaces = []
        btype, blen = struct.unpack(e + "II", data[off:off + 8])
        if blen < 12 or off + blen > len(data):   # corrupt, or still being written
            break
        body = data[off + 8:off + blen - 4]
        if btype == 1 and len(body) >= 8:          # IDB
            linktype = struct.unpack(e + "H", body[:2])[0]
            ifaces.append((linktype, _if_tsresol(body[8:], e)))
        elif btype in (6, 2) and len(body) >= 20:  # EPB, obsolete PB
            if btype == 6:
                ifid = struct.unpack(e + "I", body[:4])[0]
            else:
                ifid = struct.unpack(e + "H", body[:2])[0]
            hi, lo, incl = struct.unpack(e + "III", body[4:16])
            linktype, unit = ifaces[ifid] if ifid < len(ifaces) else (LINKTYPE_ETHERNET, 1e-6)
            out.append(Record(len(out) + 1, ((hi << 32) | lo) * unit, linktype, body[20:20 + incl]))
        elif btype == 3 and len(body) >= 4:        # SPB: interface 0, no timestamp
            linktype = ifaces[0][0] if ifaces else LINKTYPE_ETHERNET
            out.append(Record(len(out) + 1, 0.0, linktype, body[4:]))
        off += blen
    return out


def _if_tsresol(opts, e):
    """The if_tsresol option of an IDB (default: microseconds)."""
    off = 0
    while off + 4 <= len(opts):
        code, length = struct.unpack(e + "HH", opts[off:off + 4])
        if code == 0:
            break
        if code == 9 and length >= 1:
            v = opts[off + 4]
            return 2.0 ** -(v & 0x7F) if v & 0x80 else 10.0 ** -v
        off += 4 + length + (-length % 4)
    return 1e-6


def read_frames(path):
    """{frame number: bytes}, the way tshark numbers the frames."""
    return {r.num: r.data for r in read_records(path)}


def write_pcap(path, records, linktype=LINKTYPE_ETHERNET):
    """Writes (ts, bytes) pairs as a classic microsecond pcap."""
    with open(path, "wb") as f:
        f.write(struct.pack("<IHHiIII", 0xA1B2C3D4, 2, 4, 0, 0, 262144, linktype))
        for ts, frame in records:
            sec = int(ts)
            usec = min(int(round((ts - sec) * 1e6)), 999999)
            f.write(struct.pack("<IIII", sec, usec, len(frame), len(frame)) + frame)
