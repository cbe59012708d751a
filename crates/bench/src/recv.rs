//! A receive buffer shared by both protocol clients, so that they read the socket the same
//! way: as much as is available, into one reused buffer.

use std::io::{self, Read};

/// Initial buffer size: room for several 64 KiB answers.
const INITIAL_BYTES: usize = 256 << 10;
/// Free space below which the buffer is compacted before a read.
const MIN_FREE: usize = 16 << 10;
/// The buffer never grows past this: a frame or a memcached answer larger than it is a
/// protocol error (the largest answer the benchmarks ask for is 16 × 4 KiB).
pub(crate) const MAX_BUFFER_BYTES: usize = 16 << 20;

pub(crate) struct RecvBuf {
    buf: Vec<u8>,
    start: usize,
    end: usize,
}

impl RecvBuf {
    pub(crate) fn new() -> Self {
        RecvBuf { buf: vec![0; INITIAL_BYTES], start: 0, end: 0 }
    }

    /// Bytes received and not yet consumed.
    #[inline]
    pub(crate) fn data(&self) -> &[u8] {
        &self.buf[self.start..self.end]
    }

    #[inline]
    pub(crate) fn consume(&mut self, n: usize) {
        assert!(n <= self.end - self.start);
        self.start += n;
        if self.start == self.end {
            self.start = 0;
            self.end = 0;
        }
    }

    /// Move the unconsumed bytes to the front.
    fn compact(&mut self) {
        self.buf.copy_within(self.start..self.end, 0);
        self.end -= self.start;
        self.start = 0;
    }

    /// Read once more from `r`, making room for at least `want` unconsumed bytes in total.
    /// End of stream is an `UnexpectedEof` error: every caller is waiting for an answer.
    pub(crate) fn fill<R: Read>(&mut self, r: &mut R, want: usize) -> io::Result<()> {
        let have = self.end - self.start;
        let need = want.max(have + 1);
        if need > MAX_BUFFER_BYTES {
            return Err(io::Error::new(
                io::ErrorKind::InvalidData,
                format!("answer larger than {MAX_BUFFER_BYTES} bytes"),
            ));
        }
        if self.buf.len() < need {
            self.compact();
            self.buf.resize(need.next_power_of_two(), 0);
        } else if self.buf.len() - self.start < need || self.buf.len() - self.end < MIN_FREE {
            self.compact();
        }
        loop {
            match r.read(&mut self.buf[self.end..]) {
                Ok(0) => return Err(io::Error::new(io::ErrorKind::UnexpectedEof, "server closed the connection")),
                Ok(n) => {
                    self.end += n;
                    return Ok(());
                }
                Err(e) if e.kind() == io::ErrorKind::Interrupted => continue,
                Err(e) => return Err(e),
            }
        }
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;

    /// A stream for fixture tests: reads hand out `input` at most `chunk` bytes at a time
    /// (to exercise answers split across reads); writes are captured in `output`.
    pub(crate) struct Mock {
        pub input: Vec<u8>,
        pub pos: usize,
        pub chunk: usize,
        pub output: Vec<u8>,
    }

    impl Mock {
        pub(crate) fn new(input: Vec<u8>, chunk: usize) -> Self {
            Mock { input, pos: 0, chunk, output: Vec::new() }
        }
    }

    impl Read for Mock {
        fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
            let n = buf.len().min(self.chunk).min(self.input.len() - self.pos);
            buf[..n].copy_from_slice(&self.input[self.pos..self.pos + n]);
            self.pos += n;
            Ok(n)
        }
    }

    impl io::Write for Mock {
        fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
            self.output.extend_from_slice(buf);
            Ok(buf.len())
        }
        fn flush(&mut self) -> io::Result<()> {
            Ok(())
        }
    }

    #[test]
    fn fill_keeps_unconsumed_bytes_across_compaction() {
        let input: Vec<u8> = (0..600_000u32).map(|i| (i % 251) as u8).collect();
        let mut m = Mock::new(input.clone(), 100_000);
        let mut rb = RecvBuf::new();
        let mut seen = 0;
        while seen < input.len() {
            rb.fill(&mut m, 1).unwrap();
            // Consume all but 7 bytes, so compaction has to move a remainder.
            let d = rb.data();
            assert_eq!(d, &input[seen..seen + d.len()]);
            let take = if m.pos == input.len() { d.len() } else { d.len().saturating_sub(7) };
            seen += take;
            rb.consume(take);
        }
        let e = rb.fill(&mut m, 1).unwrap_err();
        assert_eq!(e.kind(), io::ErrorKind::UnexpectedEof);
    }

    #[test]
    fn fill_grows_for_a_large_answer() {
        let mut m = Mock::new(vec![7; 1 << 20], 1 << 20);
        let mut rb = RecvBuf::new();
        while rb.data().len() < 1 << 20 {
            rb.fill(&mut m, 1 << 20).unwrap();
        }
        assert!(rb.data().iter().all(|&b| b == 7));
        assert!(rb.fill(&mut m, MAX_BUFFER_BYTES + 1).is_err());
    }
}
