#!/usr/bin/env python3
"""Extract fuzz seeds from iWARP pcaps (python3 stdlib only).

Usage:  python3 fuzz/seeds/extract.py [-o OUTDIR] PCAP...
        (default OUTDIR: fuzz/seeds/captures next to this script)

For every TCP connection in every classic pcap (Ethernet, Linux SLL, raw IP or BSD
loopback link types; IPv4/IPv6), each direction's payload is reassembled by sequence
number (retransmissions dropped, reassembly stops at a hole). A direction is iWARP if it
starts with an MPA Request/Reply key, or if it starts with an FPDU that has a valid CRC32c
(a capture that began after MPA setup). Non-iWARP streams (RoCE is UDP anyway) are skipped.

Written, per iWARP direction (NAME = <pcap stem>.<sport>-<dport>):
  streams/NAME.bin                    the whole reassembled direction
  mpa_handshake/NAME.mpa              the MPA Request or Reply frame, exactly
  mpa_handshake/NAME.mpa+fpdu         the frame plus the first bytes after it (coalesced case)
  iwarp_rx_stream/NAME.<variant>      2 config bytes + the FPDU-only part of the stream
                                      (see fuzz/src/lib.rs, module rx, for the config bytes)
  wire_decoders/NAME.{mpa,fpduN,ulpduN,payloadN}
                                      single frames, ULPDUs, and Read Request / Terminate payloads
"""
import argparse
import os
import struct
import sys

MPA_KEYS = (b"MPA ID Req Frame", b"MPA ID Rep Frame")

# iwarp_rx_stream config byte 0 (must match fuzz/src/lib.rs)
FLAG_CRC, FLAG_AUTO_CRC, FLAG_QP_NO_REMOTE, FLAG_SEND_WORK, FLAG_BAD_RECV, FLAG_IRD1 = 1, 2, 4, 8, 16, 32


def _crc32c_table():
    t = []
    for i in range(256):
        c = i
        for _ in range(8):
            c = (c >> 1) ^ 0x82F63B78 if c & 1 else c >> 1
        t.append(c)
    return t


_T = _crc32c_table()


def crc32c(data):
    c = 0xFFFFFFFF
    for b in data:
        c = _T[(c ^ b) & 0xFF] ^ (c >> 8)
    return c ^ 0xFFFFFFFF


assert crc32c(b"123456789") == 0xE3069283


def fpdu_wire_len(ulen):
    return 2 + ulen + (-(2 + ulen) % 4) + 4


# ------------------------------------------------------------------ pcap / TCP

def read_pcap(path):
    """Yields (linktype, frame bytes) for each record of a classic pcap."""
    with open(path, "rb") as f:
        data = f.read()
    if len(data) < 24:
        return
    magic = data[:4]
    if magic in (b"\xd4\xc3\xb2\xa1", b"\x4d\x3c\xb2\xa1"):
        e = "<"
    elif magic in (b"\xa1\xb2\xc3\xd4", b"\xa1\xb2\x3c\x4d"):
        e = ">"
    else:
        raise ValueError(f"{path}: not a classic pcap (pcapng is not supported)")
    linktype = struct.unpack(e + "I", data[20:24])[0] & 0x0FFFFFFF
    off = 24
    while off + 16 <= len(data):
        _, _, incl, _ = struct.unpack(e + "IIII", data[off:off + 16])
        off += 16
        yield linktype, data[off:off + incl]
        off += incl


def ip_packet(linktype, frame):
    if linktype == 1:  # Ethernet
        et, off = struct.unpack("!H", frame[12:14])[0], 14
        while et in (0x8100, 0x88A8) and len(frame) >= off + 4:
            et, off = struct.unpack("!H", frame[off + 2:off + 4])[0], off + 4
        return frame[off:] if et in (0x0800, 0x86DD) else None
    if linktype == 113:  # Linux cooked
        return frame[16:]
    if linktype in (101, 228, 229):  # raw IP
        return frame
    if linktype == 0:  # BSD loopback
        return frame[4:]
    return None


def tcp_segment(ip):
    """(src, dst, sport, dport, seq, flags, payload) or None."""
    if not ip:
        return None
    v = ip[0] >> 4
    if v == 4:
        ihl = (ip[0] & 0x0F) * 4
        total = struct.unpack("!H", ip[2:4])[0]
        if ip[9] != 6:
            return None
        src, dst = ip[12:16], ip[16:20]
        seg = ip[ihl:total] if total >= ihl else ip[ihl:]
    elif v == 6:
        plen = struct.unpack("!H", ip[4:6])[0]
        if ip[6] != 6:  # extension headers are not followed
            return None
        src, dst = ip[8:24], ip[24:40]
        seg = ip[40:40 + plen]
    else:
        return None
    if len(seg) < 20:
        return None
    sport, dport, seq = struct.unpack("!HHI", seg[:8])
    doff = (seg[12] >> 4) * 4
    return src, dst, sport, dport, seq, seg[13], seg[doff:]


def reassemble(path):
    """{(src, sport, dst, dport): bytes} for every TCP direction, in first-seen order."""
    segs, isn = {}, {}
    for lt, frame in read_pcap(path):
        t = tcp_segment(ip_packet(lt, frame))
        if not t:
            continue
        src, dst, sport, dport, seq, flags, payload = t
        key = (src, sport, dst, dport)
        segs.setdefault(key, [])
        if flags & 0x02:  # SYN
            isn[key] = (seq + 1) & 0xFFFFFFFF
        if payload:
            segs[key].append((seq, payload))
    out = {}
    for key, lst in segs.items():
        if not lst:
            continue
        base = isn.get(key, lst[0][0])
        rel = sorted((((s - base) & 0xFFFFFFFF), p) for s, p in lst)
        buf, nxt = bytearray(), 0
        for off, p in rel:
            if off > nxt and not buf:
                # The capture (or the part with payload) starts mid-stream: start there.
                print(f"  {path}: {key[1]}->{key[3]} starts {off} bytes into the stream", file=sys.stderr)
                nxt = off
            if off > nxt:
                print(f"  {path}: hole in {key[1]}->{key[3]} at {nxt}; stream cut there", file=sys.stderr)
                break
            if off + len(p) > nxt:
                buf += p[nxt - off:]
                nxt = off + len(p)
        out[key] = bytes(buf)
    return out


# ------------------------------------------------------------------ iWARP split

def mpa_frame_len(s):
    if len(s) < 20 or s[:16] not in MPA_KEYS:
        return None
    return 20 + struct.unpack("!H", s[18:20])[0]


def first_fpdu_crc_ok(s):
    if len(s) < 2:
        return False
    wl = fpdu_wire_len(struct.unpack("!H", s[:2])[0])
    if len(s) < wl:
        return False
    return crc32c(s[:wl - 4]) == struct.unpack("<I", s[wl - 4:wl])[0]


def split_fpdus(s):
    """Complete FPDUs at the start of s (framing only, CRC not checked)."""
    out, pos = [], 0
    while len(s) - pos >= 2:
        wl = fpdu_wire_len(struct.unpack("!H", s[pos:pos + 2])[0])
        if len(s) - pos < wl:
            break
        out.append(s[pos:pos + wl])
        pos += wl
    return out


def write(outdir, sub, name, data):
    d = os.path.join(outdir, sub)
    os.makedirs(d, exist_ok=True)
    with open(os.path.join(d, name), "wb") as f:
        f.write(data)


def process(path, outdir):
    stem = os.path.splitext(os.path.basename(path))[0]
    streams = reassemble(path)
    # Negotiated CRC per connection: C flag in either the Request or the Reply.
    crc_by_conn = {}
    for (src, sport, dst, dport), s in streams.items():
        n = mpa_frame_len(s)
        if n is not None and len(s) >= n and s[16] & 0x40:
            conn = frozenset([(src, sport), (dst, dport)])
            crc_by_conn[conn] = True
    found = 0
    for (src, sport, dst, dport), s in streams.items():
        name = f"{stem}.{sport}-{dport}"
        n = mpa_frame_len(s)
        conn = frozenset([(src, sport), (dst, dport)])
        if n is not None:
            if len(s) < n:
                print(f"  {name}: truncated MPA frame, skipped", file=sys.stderr)
                continue
            mpa, rest = s[:n], s[n:]
            crc = crc_by_conn.get(conn, False)
        elif first_fpdu_crc_ok(s):
            mpa, rest, crc = None, s, True
        else:
            print(f"  {name}: not iWARP, skipped", file=sys.stderr)
            continue
        found += 1
        write(outdir, "streams", name + ".bin", s)
        if mpa is not None:
            write(outdir, "mpa_handshake", name + ".mpa", mpa)
            write(outdir, "mpa_handshake", name + ".mpa+fpdu", mpa + rest[:16])
            write(outdir, "wire_decoders", name + ".mpa", mpa)
        if rest:
            base = FLAG_CRC if crc else 0
            variants = {
                "raw": (base, 0),
                "chunk1": (base, 1),
                "chunk7": (base, 7),
                "work": (base | FLAG_SEND_WORK, 0),
            }
            if crc:
                variants["autocrc"] = (FLAG_CRC | FLAG_AUTO_CRC, 0)
                variants["nocrc"] = (0, 0)
            for v, (flags, chunk) in variants.items():
                write(outdir, "iwarp_rx_stream", f"{name}.{v}", bytes([flags, chunk]) + rest)
        for i, fp in enumerate(split_fpdus(rest)):
            write(outdir, "wire_decoders", f"{name}.fpdu{i}", fp)
            ulen = struct.unpack("!H", fp[:2])[0]
            ulpdu = fp[2:2 + ulen]
            write(outdir, "wire_decoders", f"{name}.ulpdu{i}", ulpdu)
            if len(ulpdu) >= 2:
                hlen = 14 if ulpdu[0] & 0x80 else 18
                if ulpdu[1] & 0x0F in (1, 7) and len(ulpdu) > hlen:  # Read Request, Terminate
                    write(outdir, "wire_decoders", f"{name}.payload{i}", ulpdu[hlen:])
        print(f"  {name}: {'MPA ' if mpa else 'no MPA setup, '}crc={crc}, "
              f"{len(split_fpdus(rest))} FPDUs, {len(rest)} FPDU bytes")
    return found


def main():
    ap = argparse.ArgumentParser(description=__doc__, formatter_class=argparse.RawDescriptionHelpFormatter)
    ap.add_argument("-o", "--outdir", default=os.path.join(os.path.dirname(os.path.abspath(__file__)), "captures"))
    ap.add_argument("pcaps", nargs="+")
    a = ap.parse_args()
    total = 0
    for p in a.pcaps:
        print(p)
        total += process(p, a.outdir)
    print(f"{total} iWARP stream directions written under {a.outdir}")


if __name__ == "__main__":
    main()
