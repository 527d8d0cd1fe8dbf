//! The private-data messages `softrdma perf` exchanges at connection time (little endian).

use super::Test;

const MAGIC: &[u8; 4] = b"SRPF";
const VERSION: u8 = 1;

/// Client → server: what to run, and where the client's buffer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Request {
    pub test: Test,
    pub last: bool,
    pub verify: bool,
    pub size: u32,
    pub iters: u32,
    pub addr: u64,
    pub rkey: u32,
}

/// Server → client: where the server's buffer is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Reply {
    pub addr: u64,
    pub rkey: u32,
    pub len: u32,
}

impl Request {
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(28);
        v.extend_from_slice(MAGIC);
        v.extend_from_slice(&[VERSION, self.test.id(), self.last as u8, self.verify as u8]);
        v.extend_from_slice(&self.size.to_le_bytes());
        v.extend_from_slice(&self.iters.to_le_bytes());
        v.extend_from_slice(&self.addr.to_le_bytes());
        v.extend_from_slice(&self.rkey.to_le_bytes());
        v
    }

    pub fn decode(b: &[u8]) -> Result<Request, String> {
        if b.len() < 28 || &b[..4] != MAGIC || b[4] != VERSION {
            return Err(format!(
                "not a softrdma perf request ({} bytes of private data)",
                b.len()
            ));
        }
        let test = Test::from_id(b[5]).ok_or_else(|| format!("unknown perf test id {}", b[5]))?;
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[16..24]);
        Ok(Request {
            test,
            last: b[6] != 0,
            verify: b[7] != 0,
            size: u32_at(8),
            iters: u32_at(12),
            addr: u64::from_le_bytes(a),
            rkey: u32_at(24),
        })
    }
}

impl Reply {
    pub fn encode(&self) -> Vec<u8> {
        let mut v = Vec::with_capacity(24);
        v.extend_from_slice(MAGIC);
        v.extend_from_slice(&[VERSION, 0, 0, 0]);
        v.extend_from_slice(&self.addr.to_le_bytes());
        v.extend_from_slice(&self.rkey.to_le_bytes());
        v.extend_from_slice(&self.len.to_le_bytes());
        v
    }

    pub fn decode(b: &[u8]) -> Result<Reply, String> {
        if b.len() < 24 || &b[..4] != MAGIC {
            return Err("the server's reply is not a softrdma perf reply".into());
        }
        let mut a = [0u8; 8];
        a.copy_from_slice(&b[8..16]);
        let u32_at = |i: usize| u32::from_le_bytes([b[i], b[i + 1], b[i + 2], b[i + 3]]);
        Ok(Reply {
            addr: u64::from_le_bytes(a),
            rkey: u32_at(16),
            len: u32_at(20),
        })
    }
}

/// The data pattern for a message: depends on the size and an iteration seed.
pub fn pattern(len: usize, seed: u32) -> Vec<u8> {
    let mut x = seed.wrapping_mul(0x9e37_79b9) ^ (len as u32);
    (0..len)
        .map(|_| {
            x ^= x << 13;
            x ^= x >> 17;
            x ^= x << 5;
            x as u8
        })
        .collect()
}

/// The flag byte iteration `i` ends with (consecutive iterations differ, never 0).
pub fn marker(i: u32) -> u8 {
    (i % 250) as u8 + 1
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn round_trip() {
        let r = Request {
            test: Test::ReadLat,
            last: true,
            verify: true,
            size: 4096,
            iters: 7,
            addr: 0x1234_5678_9abc,
            rkey: 0xdead,
        };
        assert_eq!(Request::decode(&r.encode()), Ok(r));
        let p = Reply {
            addr: 1,
            rkey: 2,
            len: 3,
        };
        assert_eq!(Reply::decode(&p.encode()), Ok(p));
        assert!(Request::decode(b"nope").is_err());
        assert_ne!(marker(0), marker(1));
        assert_ne!(pattern(16, 1), pattern(16, 2));
    }
}
