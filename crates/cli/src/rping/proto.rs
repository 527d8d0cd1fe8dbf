//! rping's wire format and ping data: `struct rping_rdma_info` in network byte order, and the
//! text the client puts in its start buffer.

/// Largest ping size (`RPING_BUFSIZE - 1`).
pub const MAX_SIZE: u32 = 64 * 1024 - 1;

/// Smallest ping size (`RPING_MIN_BUFSIZE`: `sizeof "2147483647"` + `sizeof "rdma-ping-%d: "`),
/// so the prefix of any ping number fits.
pub const MIN_SIZE: u32 = 11 + 15;

/// First and last pattern characters ('A' and 'z').
const FIRST: u8 = 65;
const LAST: u8 = 122;

/// Checks `-S` as rping does.
pub fn check_size(size: u32) -> Result<(), String> {
    if !(MIN_SIZE..=MAX_SIZE).contains(&size) {
        return Err(format!("Invalid size {size} (valid range is {MIN_SIZE} to {MAX_SIZE})"));
    }
    Ok(())
}

/// `struct rping_rdma_info { __be64 buf; __be32 rkey; __be32 size; }`: a buffer the peer may
/// read or write.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct RdmaInfo {
    /// Address of the buffer (the MR's address).
    pub buf: u64,
    /// Its rkey.
    pub rkey: u32,
    /// Its length.
    pub size: u32,
}

impl RdmaInfo {
    /// Bytes on the wire.
    pub const LEN: usize = 16;

    /// Network byte order, as the C struct after `htobe64`/`htobe32`.
    pub fn encode(&self) -> [u8; Self::LEN] {
        let mut b = [0u8; Self::LEN];
        b[..8].copy_from_slice(&self.buf.to_be_bytes());
        b[8..12].copy_from_slice(&self.rkey.to_be_bytes());
        b[12..].copy_from_slice(&self.size.to_be_bytes());
        b
    }

    /// Decodes exactly [`RdmaInfo::LEN`] bytes.
    pub fn decode(b: &[u8]) -> Option<RdmaInfo> {
        let b: &[u8; Self::LEN] = b.try_into().ok()?;
        let (buf, rest) = b.split_at(8);
        let (rkey, size) = rest.split_at(4);
        Some(RdmaInfo {
            buf: u64::from_be_bytes(buf.try_into().ok()?),
            rkey: u32::from_be_bytes(rkey.try_into().ok()?),
            size: u32::from_be_bytes(size.try_into().ok()?),
        })
    }
}

/// Fills `buf` as rping's client does for ping `ping`: `"rdma-ping-<n>: "`, then characters
/// from `start` cycling through 'A'..='z', then a terminating NUL in the last byte.
pub fn fill_ping(buf: &mut [u8], ping: u32, start: u8) {
    let prefix = format!("rdma-ping-{ping}: ");
    let n = prefix.len().min(buf.len().saturating_sub(1));
    buf[..n].copy_from_slice(&prefix.as_bytes()[..n]);
    let mut c = start;
    for b in buf.iter_mut().skip(prefix.len()) {
        *b = c;
        c = next_char(c);
    }
    if let Some(last) = buf.last_mut() {
        *last = 0;
    }
}

/// The pattern character after `c`, and the next ping's start character.
pub fn next_char(c: u8) -> u8 {
    if c >= LAST {
        FIRST
    } else {
        c + 1
    }
}

/// The first ping's start character.
pub const START: u8 = FIRST;

/// The C string at the start of `buf` (up to its NUL), for display.
pub fn c_str(buf: &[u8]) -> String {
    let end = buf.iter().position(|&b| b == 0).unwrap_or(buf.len());
    String::from_utf8_lossy(&buf[..end]).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn info_is_big_endian_and_16_bytes() {
        let i = RdmaInfo {
            buf: 0x0102_0304_0506_0708,
            rkey: 0x0a0b_0c0d,
            size: 64,
        };
        let b = i.encode();
        assert_eq!(b, [1, 2, 3, 4, 5, 6, 7, 8, 0x0a, 0x0b, 0x0c, 0x0d, 0, 0, 0, 64]);
        assert_eq!(RdmaInfo::decode(&b), Some(i));
        assert_eq!(RdmaInfo::decode(&b[..15]), None);
    }

    #[test]
    fn ping_text_matches_rping() {
        let mut b = vec![0xffu8; 32];
        fill_ping(&mut b, 7, b'y');
        assert_eq!(c_str(&b), "rdma-ping-7: yzABCDEFGHIJKLMNOP");
        assert_eq!(b[31], 0);
        assert_eq!(next_char(b'z'), b'A');
        assert!(check_size(25).is_err() && check_size(26).is_ok() && check_size(65536).is_err());
    }
}
