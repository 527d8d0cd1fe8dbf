//! The hostile peer: a raw `std::net::TcpStream` that performs the MPA exchange itself (as the
//! initiator) and then sends frames built with the `softrdma-wire` encoders, valid or not.
//! Also the process probes the hostile-peer tests use (fd count, progress-thread CPU time).
#![allow(dead_code)]

use softrdma_wire::{
    emit_fpdu, parse_fpdu, DdpHeader, IrdOrd, MpaFrame, MpaKind, Opcode, ReadRequest, SegmentHeader, Terminate,
    WireError, QN_READ_REQUEST, QN_SEND,
};
use std::io::{ErrorKind, Read, Seek, Write};
use std::net::{Shutdown, SocketAddr, TcpStream};
use std::time::{Duration, Instant};

/// Bound on every wait for an outcome.
pub const BOUND: Duration = Duration::from_secs(5);

/// How the victim's side of a raw connection looked when we stopped reading.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum End {
    /// The victim closed cleanly (FIN).
    Eof,
    /// The victim reset the connection (RST).
    Reset,
    /// Still open when the bound passed.
    Open,
}

impl End {
    /// EOF or RST: the victim closed the connection.
    pub fn closed(self) -> bool {
        self != End::Open
    }
}

/// A raw TCP peer of a softrdma listener.
pub struct RawPeer {
    /// The socket.
    pub sock: TcpStream,
    /// FPDU CRC32c as negotiated (sent on every FPDU we emit; checked on what we receive).
    pub crc: bool,
    /// Bytes received and not yet consumed.
    pub buf: Vec<u8>,
}

impl RawPeer {
    /// A plain TCP connection.
    pub fn connect(addr: SocketAddr) -> RawPeer {
        let sock = TcpStream::connect_timeout(&addr, BOUND).unwrap_or_else(|e| panic!("connect {addr}: {e}"));
        RawPeer::from_stream(sock)
    }

    /// Wraps a connected stream.
    pub fn from_stream(sock: TcpStream) -> RawPeer {
        let _ = sock.set_nodelay(true);
        RawPeer {
            sock,
            crc: false,
            buf: Vec::new(),
        }
    }

    /// Our local address (the victim's `peer_addr` for this connection).
    pub fn local_addr(&self) -> SocketAddr {
        self.sock.local_addr().expect("local_addr")
    }

    /// Sends bytes (panics on failure: the victim must not close before reading an attack).
    pub fn send(&mut self, bytes: &[u8]) {
        self.sock.write_all(bytes).expect("send to the victim");
    }

    /// Sends bytes, reporting failure (for attacks the victim may cut short).
    pub fn try_send(&mut self, bytes: &[u8]) -> std::io::Result<()> {
        self.sock.write_all(bytes)
    }

    /// Half-closes our sending side (FIN).
    pub fn finish(&self) {
        let _ = self.sock.shutdown(Shutdown::Write);
    }

    /// Reads once (waiting at most until `deadline`). `Some(end)` when the connection ended or
    /// the deadline passed, `None` after appending some bytes to `buf`.
    fn read_once(&mut self, deadline: Instant) -> Option<End> {
        let left = deadline.saturating_duration_since(Instant::now());
        if left.is_zero() {
            return Some(End::Open);
        }
        let _ = self.sock.set_read_timeout(Some(left));
        let mut chunk = [0u8; 16384];
        match self.sock.read(&mut chunk) {
            Ok(0) => Some(End::Eof),
            Ok(n) => {
                self.buf.extend_from_slice(&chunk[..n]);
                None
            }
            Err(e) if matches!(e.kind(), ErrorKind::WouldBlock | ErrorKind::TimedOut) => Some(End::Open),
            Err(e) if e.kind() == ErrorKind::Interrupted => None,
            Err(e) if matches!(e.kind(), ErrorKind::ConnectionReset | ErrorKind::ConnectionAborted) => Some(End::Reset),
            Err(e) => panic!("read from the victim: {e}"),
        }
    }

    /// Reads everything until the victim closes or `bound` passes.
    pub fn read_until_end(&mut self, bound: Duration) -> End {
        let deadline = Instant::now() + bound;
        loop {
            if let Some(end) = self.read_once(deadline) {
                return end;
            }
        }
    }

    /// Waits for an MPA Reply (consumed from `buf`). `Err(end)` if the connection ended (or the
    /// bound passed) first; panics on bytes that are not an MPA Reply.
    pub fn mpa_reply(&mut self, bound: Duration) -> Result<MpaFrame, End> {
        let deadline = Instant::now() + bound;
        loop {
            match MpaFrame::parse(&self.buf) {
                Ok(Some((frame, used))) => {
                    assert_eq!(frame.kind, MpaKind::Reply, "the victim sent an MPA request");
                    self.buf.drain(..used);
                    return Ok(frame);
                }
                Ok(None) => {}
                Err(e) => panic!(
                    "the victim sent something that is not an MPA reply: {e}: {:02x?}",
                    self.buf
                ),
            }
            if let Some(end) = self.read_once(deadline) {
                return Err(end);
            }
        }
    }

    /// Connects, sends a valid MPA Request (revision 2, IRD/ORD 16, CRC as asked) and expects an
    /// accepting Reply. The victim's application accepts by private data.
    pub fn handshake(addr: SocketAddr, private_data: &[u8], crc: bool) -> RawPeer {
        let mut p = RawPeer::connect(addr);
        p.send(&request_bytes(private_data, crc));
        let reply = p
            .mpa_reply(BOUND)
            .unwrap_or_else(|end| panic!("no MPA reply from {addr}: connection {end:?}"));
        assert!(!reply.reject, "the victim rejected a valid request: {reply:?}");
        assert_eq!(reply.crc, crc, "CRC negotiation");
        p.crc = reply.crc;
        p
    }

    /// Sends one FPDU carrying `hdr` + `payload` with a correct CRC (when negotiated).
    pub fn send_segment(&mut self, hdr: &SegmentHeader, payload: &[u8]) {
        let f = fpdu(&segment(hdr, payload), self.crc);
        self.send(&f);
    }

    /// ULPDUs framed from everything received (CRC checked when negotiated); the rest stays in `buf`.
    pub fn take_ulpdus(&mut self) -> Vec<Vec<u8>> {
        let mut out = Vec::new();
        let mut at = 0;
        while let Some(f) = parse_fpdu(&self.buf[at..], self.crc)
            .unwrap_or_else(|e| panic!("the victim sent a bad FPDU: {e}: {:02x?}", &self.buf[at..]))
        {
            out.push(f.ulpdu.to_vec());
            at += f.wire_len;
        }
        self.buf.drain(..at);
        out
    }

    /// Reads until the victim closes (or `bound`), then frames what arrived.
    pub fn ulpdus_until_end(&mut self, bound: Duration) -> (Vec<Vec<u8>>, End) {
        let end = self.read_until_end(bound);
        let ulpdus = self.take_ulpdus();
        (ulpdus, end)
    }

    /// Reads until `n` complete ULPDUs arrived (or the connection ended / `bound` passed).
    pub fn ulpdus(&mut self, n: usize, bound: Duration) -> (Vec<Vec<u8>>, Option<End>) {
        let deadline = Instant::now() + bound;
        let mut got = Vec::new();
        loop {
            got.extend(self.take_ulpdus());
            if got.len() >= n {
                return (got, None);
            }
            if let Some(end) = self.read_once(deadline) {
                got.extend(self.take_ulpdus());
                return (got, Some(end));
            }
        }
    }
}

/// A valid MPA Request frame: revision 2, enhanced setup with IRD = ORD = 16, no peer-to-peer RTR.
pub fn request_frame(private_data: &[u8], crc: bool) -> MpaFrame {
    MpaFrame {
        kind: MpaKind::Request,
        markers: false,
        crc,
        reject: false,
        revision: 2,
        enhanced: Some(IrdOrd {
            ird: 16,
            ord: 16,
            ..IrdOrd::default()
        }),
        private_data: private_data.to_vec(),
    }
}

/// The bytes of a frame.
pub fn frame_bytes(f: &MpaFrame) -> Vec<u8> {
    let mut out = Vec::new();
    f.emit(&mut out).expect("MPA frame");
    out
}

/// The bytes of [`request_frame`].
pub fn request_bytes(private_data: &[u8], crc: bool) -> Vec<u8> {
    frame_bytes(&request_frame(private_data, crc))
}

/// A DDP segment (the ULPDU): header then payload.
pub fn segment(hdr: &SegmentHeader, payload: &[u8]) -> Vec<u8> {
    let mut out = Vec::with_capacity(hdr.len() + payload.len());
    hdr.emit(&mut out);
    out.extend_from_slice(payload);
    out
}

/// One FPDU around `ulpdu`.
pub fn fpdu(ulpdu: &[u8], crc: bool) -> Vec<u8> {
    let mut out = Vec::new();
    emit_fpdu(&[ulpdu], crc, &mut out).expect("ULPDU fits an FPDU");
    out
}

/// An RDMA WRITE segment header.
pub fn write_hdr(stag: u32, to: u64) -> SegmentHeader {
    SegmentHeader {
        last: true,
        opcode: Opcode::RdmaWrite,
        ddp: DdpHeader::Tagged { stag, to },
    }
}

/// An untagged SEND-family segment header on queue 0.
pub fn send_hdr(opcode: Opcode, msn: u32, inval_stag: u32) -> SegmentHeader {
    SegmentHeader {
        last: true,
        opcode,
        ddp: DdpHeader::Untagged {
            inval_stag,
            qn: QN_SEND,
            msn,
            mo: 0,
        },
    }
}

/// An RDMA READ Request segment (header + 28-byte payload) as one ULPDU.
pub fn read_request(msn: u32, src_stag: u32, src_to: u64, size: u32) -> Vec<u8> {
    let hdr = SegmentHeader {
        last: true,
        opcode: Opcode::ReadRequest,
        ddp: DdpHeader::Untagged {
            inval_stag: 0,
            qn: QN_READ_REQUEST,
            msn,
            mo: 0,
        },
    };
    let rr = ReadRequest {
        sink_stag: 0x5151_5100,
        sink_to: 0x1000,
        size,
        src_stag,
        src_to,
    };
    let mut payload = Vec::new();
    rr.emit(&mut payload);
    segment(&hdr, &payload)
}

/// The Terminate carried by a ULPDU, if it is one.
pub fn as_terminate(ulpdu: &[u8]) -> Option<Terminate> {
    let (h, n) = SegmentHeader::parse(ulpdu).ok()?;
    (h.opcode == Opcode::Terminate).then(|| Terminate::parse(&ulpdu[n..]).expect("a well-formed Terminate"))
}

/// The segment header of a ULPDU (panics on a malformed one: the victim's frames must decode).
pub fn header_of(ulpdu: &[u8]) -> SegmentHeader {
    SegmentHeader::parse(ulpdu)
        .map(|(h, _)| h)
        .unwrap_or_else(|e: WireError| panic!("bad segment from the victim: {e}"))
}

/// Open file descriptors of this process.
pub fn fd_count() -> usize {
    std::fs::read_dir("/proc/self/fd").map(|d| d.count()).unwrap_or(0)
}

/// The progress thread's `/proc/self/task/<tid>/stat`, kept open so it can be re-read even
/// when the process has no file descriptor to spare.
pub struct ThreadCpu {
    stat: std::fs::File,
}

impl ThreadCpu {
    /// Finds the thread named `softrdma-progress` (the kernel keeps 15 characters of a name).
    pub fn progress_thread() -> ThreadCpu {
        for task in std::fs::read_dir("/proc/self/task").expect("/proc/self/task").flatten() {
            let comm = std::fs::read_to_string(task.path().join("comm")).unwrap_or_default();
            if comm.trim_end() == "softrdma-progre" || comm.trim_end() == "softrdma-progress" {
                let stat = std::fs::File::open(task.path().join("stat")).expect("stat");
                return ThreadCpu { stat };
            }
        }
        panic!("no softrdma-progress thread in this process");
    }

    /// CPU time used so far (user + system).
    pub fn used(&mut self) -> Duration {
        let mut s = String::new();
        self.stat.rewind().expect("rewind stat");
        self.stat.read_to_string(&mut s).expect("read stat");
        // Fields after the parenthesised name: state is field 3; utime and stime are 14 and 15.
        let rest = &s[s.rfind(')').expect("stat format") + 2..];
        let f: Vec<&str> = rest.split_whitespace().collect();
        let ticks: u64 = f[11].parse::<u64>().expect("utime") + f[12].parse::<u64>().expect("stime");
        // SAFETY: sysconf has no preconditions.
        let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) }.max(1) as u64;
        Duration::from_millis(ticks * 1000 / hz)
    }

    /// CPU time the thread uses during `window`.
    pub fn during(&mut self, window: Duration) -> Duration {
        let before = self.used();
        std::thread::sleep(window);
        self.used().saturating_sub(before)
    }
}

/// Waits until `cond` holds, at most `bound`. Returns whether it held.
pub fn eventually(bound: Duration, mut cond: impl FnMut() -> bool) -> bool {
    let deadline = Instant::now() + bound;
    loop {
        if cond() {
            return true;
        }
        if Instant::now() >= deadline {
            return false;
        }
        std::thread::sleep(Duration::from_millis(5));
    }
}
