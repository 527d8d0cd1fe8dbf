"""realign - re-cut each MPA connection of a capture into one FPDU per TCP segment.

Why: Wireshark 4.0's MPA dissector loses FPDU framing for the rest of a connection when a
TCP segment completes a reassembled FPDU and then carries fewer than 8 bytes of the next
FPDU (the MPA heuristic refuses such a short remainder). Senders may cut the byte stream
anywhere (RFC 5044 only recommends FPDU alignment), and under load Linux TCP does, so a
big-transfer capture decodes as garbage from that segment on although every byte is right.

What: both directions of a connection that starts with an MPA Request/Reply (no markers,
not rejected) are reassembled from the capture; the stream is cut where the MPA header's
PD_Length and each FPDU's ULPDU_Length say, and every piece becomes one TCP segment with
the original sequence number, placed where the capture completed it. Everything else
(handshake, ACKs, other traffic) is copied unchanged. Wireshark then decodes every FPDU on
its own, so its CRC, DDP and RDMAP checks see all of them; a wrong length field still
shows as the next FPDU decoding as garbage.

Holes (bytes never captured) and retransmissions whose bytes differ are reported, and the
connection is left as captured.
"""
import struct

from pcapio import LINKTYPE_ETHERNET

MPA_KEY_REQ = b"MPA ID Req Frame"
MPA_KEY_REP = b"MPA ID Rep Frame"
MPA_HDR_LEN, MPA_MAX_PD = 20, 512
MPA_M, MPA_R = 0x80, 0x20
TCP_FIN, TCP_SYN, TCP_RST, TCP_PSH, TCP_ACK = 0x01, 0x02, 0x04, 0x08, 0x10
# largest TCP payload one synthetic segment carries (IPv4 total length is 16 bits)
MAX_V4_PAYLOAD, MAX_V6_PAYLOAD = 65535 - 40, 65535 - 20


class Tcp:
    """The parts of a captured Ethernet/IP/TCP frame that re-cutting needs."""
    __slots__ = ("l2", "v6", "ip", "src", "dst", "sport", "dport", "seq", "ack", "flags",
                 "win", "payload")


def parse_tcp(data):
    """Ethernet (optionally VLAN-tagged) IPv4/IPv6 TCP -> Tcp, else None."""
    off = 12
    if len(data) < 14:
        return None
    et = struct.unpack("!H", data[off:off + 2])[0]
    while et in (0x8100, 0x88A8) and len(data) >= off + 6:
        off += 4
        et = struct.unpack("!H", data[off:off + 2])[0]
    off += 2
    ip = data[off:]
    t = Tcp()
    t.l2 = data[:off]
    if et == 0x0800 and len(ip) >= 20 and ip[0] >> 4 == 4:
        ihl, total = (ip[0] & 0x0F) * 4, struct.unpack("!H", ip[2:4])[0]
        if ip[9] != 6 or struct.unpack("!H", ip[6:8])[0] & 0x3FFF or total < ihl + 20:
            return None      # not TCP, or a fragment
        t.v6, t.ip, t.src, t.dst, seg = False, ip[:ihl], ip[12:16], ip[16:20], ip[ihl:total]
    elif et == 0x86DD and len(ip) >= 60 and ip[0] >> 4 == 6:
        if ip[6] != 6:
            return None      # extension headers: left alone
        plen = struct.unpack("!H", ip[4:6])[0]
        t.v6, t.ip, t.src, t.dst, seg = True, ip[:40], ip[8:24], ip[24:40], ip[40:40 + plen]
    else:
        return None
    if len(seg) < 20:
        return None
    t.sport, t.dport, t.seq, t.ack = struct.unpack("!HHII", seg[:12])
    doff = (seg[12] >> 4) * 4
    if doff < 20 or len(seg) < doff:
        return None
    t.flags, t.win = seg[13], struct.unpack("!H", seg[14:16])[0]
    t.payload = seg[doff:]
    return t


def internet_checksum(data):
    """The 16-bit one's complement checksum of IP/TCP/UDP headers (RFC 1071)."""
    if len(data) % 2:
        data += b"\0"
    s = sum(struct.unpack("!%dH" % (len(data) // 2), data))
    while s >> 16:
        s = (s & 0xFFFF) + (s >> 16)
    return ~s & 0xFFFF


def build_segment(t, seq, flags, payload):
    """A frame with t's link and IP headers and a 20-byte TCP header carrying payload."""
    seg = bytearray(struct.pack("!HHIIBBHHH", t.sport, t.dport, seq, t.ack, 0x50, flags,
                                t.win, 0, 0) + payload)
    if t.v6:
        pseudo = t.src + t.dst + struct.pack("!IxxxB", len(seg), 6)
    else:
        pseudo = t.src + t.dst + struct.pack("!xBH", 6, len(seg))
    seg[16:18] = struct.pack("!H", internet_checksum(pseudo + bytes(seg)))
    if t.v6:
        ip = t.ip[:4] + struct.pack("!HBB", len(seg), 6, t.ip[7]) + t.src + t.dst
    else:
        hdr = bytearray(struct.pack("!BBHHHBBH", 0x45, t.ip[1], 20 + len(seg),
                                    struct.unpack("!H", t.ip[4:6])[0],
                                    struct.unpack("!H", t.ip[6:8])[0] & 0x4000, t.ip[8], 6, 0)
                        + t.src + t.dst)
        hdr[10:12] = struct.pack("!H", internet_checksum(bytes(hdr)))
        ip = bytes(hdr)
    return t.l2 + ip + bytes(seg)


class Flow:
    """One direction of a TCP connection, in stream offsets (0 = the byte after the SYN)."""

    def __init__(self, isn):
        self.isn = isn
        self.data = bytearray()
        self.have = []          # sorted, merged [start, end) intervals that were captured
        self.mismatch = None    # (frame, offset) of retransmitted bytes that differ
        self.pdus = []          # [start, end) cut points, set once the flow is known to be MPA
        self.kinds = []         # "mpa" | "fpdu" | "tail" per pdu
        self.last_frame = None
        self.ports = (0, 0)
        self.peer = None        # the other direction
        self.recut = False
        # while emitting: intervals seen so far, next PDU, stream offset emitted, last frame
        self.seen, self.done, self.sent, self.last = [], 0, 0, None

    def contig(self):
        """Bytes from offset 0 that the frames emitted so far carried without a gap."""
        return self.seen[0][1] if self.seen and self.seen[0][0] == 0 else 0

    def off(self, seq):
        return (seq - self.isn - 1) & 0xFFFFFFFF

    def add(self, frame, start, payload):
        end = start + len(payload)
        if end > len(self.data):
            self.data.extend(bytes(end - len(self.data)))
        pos = start                      # bytes captured twice must agree; the first copy stays
        for a, b in self.have + [(end, end)]:
            lo, hi = max(a, start), min(b, end)
            if lo < hi and self.mismatch is None and self.data[lo:hi] != payload[lo - start:hi - start]:
                self.mismatch = (frame, lo)
            if a > pos:
                stop = min(a, end)
                self.data[pos:stop] = payload[pos - start:stop - start]
            pos = max(pos, b)
            if pos >= end:
                break
        self.have = _merge(self.have + [(start, end)])
        self.last_frame = frame

    def hole(self):
        """The first missing [start, end), or None when the captured bytes are contiguous."""
        if not self.have:
            return None
        if self.have[0][0] > 0:
            return (0, self.have[0][0])
        if len(self.have) > 1:
            return (self.have[0][1], self.have[1][0])
        return None

    def cut(self, first_len):
        """PDU boundaries: the MPA Request/Reply (first_len bytes), then FPDUs by ULPDU_Length."""
        n, off = len(self.data), first_len
        self.pdus, self.kinds = [(0, first_len)], ["mpa"]
        while off + 2 <= n:
            ulpdu = struct.unpack("!H", self.data[off:off + 2])[0]
            total = 2 + ulpdu
            total += (-total % 4) + 4
            if off + total > n:
                break
            self.pdus.append((off, off + total))
            self.kinds.append("fpdu")
            off += total
        if off < n:
            self.pdus.append((off, n))
            self.kinds.append("tail")


def _merge(iv):
    iv.sort()
    out = []
    for a, b in iv:
        if out and a <= out[-1][1]:
            out[-1] = (out[-1][0], max(out[-1][1], b))
        else:
            out.append((a, b))
    return out


def _mpa_header(flow, key):
    """Length of the MPA Request/Reply at the start of flow, or None if it is not one we cut."""
    d = flow.data
    if len(d) < MPA_HDR_LEN or bytes(d[:16]) != key:
        return None
    flags, pd = d[16], struct.unpack("!H", d[18:20])[0]
    if flags & (MPA_M | MPA_R) or pd > MPA_MAX_PD or len(d) < MPA_HDR_LEN + pd:
        return None
    return MPA_HDR_LEN + pd


class Result:
    def __init__(self):
        self.frames = []        # (ts, bytes) of the re-cut capture
        self.labels = {}        # re-cut frame number -> original frame number
        self.connections = 0
        self.fpdus = 0          # complete FPDUs cut
        self.recut = 0          # original data segments replaced
        self.fail = []          # (original frame, message)


def realign(records):
    """records (pcapio.Record, capture order) -> Result, or None when there is no MPA
    connection to re-cut (or the capture is not Ethernet)."""
    if not records or any(r.linktype != LINKTYPE_ETHERNET for r in records):
        return None
    parsed = [parse_tcp(r.data) for r in records]
    owner = [None] * len(records)     # the Flow each TCP frame belongs to (4-tuples get reused)
    current, flows = {}, []
    for i, (r, t) in enumerate(zip(records, parsed)):
        if t is None:
            continue
        key = (t.src, t.sport, t.dst, t.dport)
        if t.flags & TCP_SYN:
            f = current.get(key)
            if f is None or f.isn != t.seq or f.have:    # else a retransmitted SYN
                f = current[key] = Flow(t.seq)
                f.ports = (t.sport, t.dport)
                flows.append(f)
                back = current.get((t.dst, t.dport, t.src, t.sport))
                if t.flags & TCP_ACK and back is not None:
                    f.peer, back.peer = back, f
            owner[i] = f
            continue
        f = current.get(key)
        owner[i] = f
        if f is not None and t.payload:
            f.add(r.num, f.off(t.seq), t.payload)

    res = Result()
    for f in flows:
        back = f.peer
        if back is None or f.recut:
            continue
        req_len = _mpa_header(f, MPA_KEY_REQ)
        rep_len = _mpa_header(back, MPA_KEY_REP)
        if req_len is None or rep_len is None:
            continue
        ok = True
        for g in (f, back):
            h = g.hole()
            if h is not None:
                res.fail.append((g.last_frame, "capture has holes: bytes %d..%d of TCP port %d -> %d "
                                 "were never captured; this MPA connection cannot be re-cut"
                                 % (h[0], h[1], g.ports[0], g.ports[1])))
                ok = False
            if g.mismatch is not None:
                res.fail.append((g.mismatch[0], "TCP retransmission with different bytes at stream "
                                 "offset %d" % g.mismatch[1]))
                ok = False
        if not ok:
            continue
        f.cut(req_len)
        back.cut(rep_len)
        f.recut = back.recut = True
        res.connections += 1
        res.fpdus += f.kinds.count("fpdu") + back.kinds.count("fpdu")

    if not res.connections:
        return res if res.fail else None
    _emit(records, parsed, owner, res)
    return res


def _emit(records, parsed, owner, res):
    def out(ts, frame, orig):
        res.frames.append((ts, frame))
        res.labels[len(res.frames)] = orig

    def flush(f, t, ts, orig, upto):
        limit = MAX_V6_PAYLOAD if t.v6 else MAX_V4_PAYLOAD
        while f.done < len(f.pdus) and f.pdus[f.done][1] <= upto:
            a, b = f.pdus[f.done]
            for c in range(a, b, limit):
                seq = (f.isn + 1 + c) & 0xFFFFFFFF
                out(ts, build_segment(t, seq, TCP_PSH | (t.flags & TCP_ACK),
                                      bytes(f.data[c:min(b, c + limit)])), orig)
            f.done += 1
            f.sent = b

    recut = []
    for r, t, f in zip(records, parsed, owner):
        if f is None or not f.recut or t.flags & TCP_SYN:
            out(r.ts, r.data, r.num)
            continue
        if not t.payload:
            if f.off(t.seq) > f.sent:
                # an ACK sent while an FPDU of this direction was partly out: its sequence
                # number points into bytes that the re-cut capture has not carried yet
                out(r.ts, build_segment(t, (f.isn + 1 + f.sent) & 0xFFFFFFFF, t.flags, b""), r.num)
            else:
                out(r.ts, r.data, r.num)
            continue
        start = f.off(t.seq)
        before = f.contig()
        f.seen = _merge(f.seen + [(start, start + len(t.payload))])
        if f.contig() > before:
            res.recut += 1
        if f.last is None:
            recut.append(f)
        f.last = (t, r)
        flush(f, t, r.ts, r.num, f.contig())
        if t.flags & (TCP_FIN | TCP_RST):
            seq = (t.seq + len(t.payload)) & 0xFFFFFFFF if t.flags & TCP_FIN else t.seq
            out(r.ts, build_segment(t, seq, t.flags & (TCP_FIN | TCP_RST | TCP_ACK), b""), r.num)
    for f in recut:
        t, r = f.last
        flush(f, t, r.ts, r.num, len(f.data))   # a torn tail, if any
