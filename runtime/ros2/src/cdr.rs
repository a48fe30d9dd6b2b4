//! Classic CDR (OMG XCDR1, little-endian), the payload encoding of ROS 2 over rmw_zenoh (Fast-CDR
//! `DDS_CDR`): a 4-byte encapsulation header `00 01 00 00`, then the fields in declaration
//! order, each primitive aligned to its own size counted from the end of the header, strings as a
//! `u32` length including the terminating NUL, sequences as a `u32` count then the elements,
//! fixed arrays as the elements alone.

/// The encapsulation header of little-endian classic CDR.
pub const HEADER_LE: [u8; 4] = [0x00, 0x01, 0x00, 0x00];

/// Writes one CDR message into a reusable buffer.
#[derive(Debug, Default)]
pub struct Writer {
    buf: Vec<u8>,
}

impl Writer {
    /// An empty writer; [`Writer::start`] begins each message.
    pub fn new() -> Self {
        Self::default()
    }

    /// Clears the buffer (keeping its capacity) and writes the header.
    pub fn start(&mut self) -> &mut Self {
        self.buf.clear();
        self.buf.extend_from_slice(&HEADER_LE);
        self
    }

    /// The message written so far, header included.
    pub fn bytes(&self) -> &[u8] {
        &self.buf
    }

    fn align(&mut self, n: usize) {
        let off = self.buf.len() - HEADER_LE.len();
        let pad = (n - off % n) % n;
        self.buf.extend(std::iter::repeat_n(0u8, pad));
    }

    /// A `uint8`, `byte` or `char`.
    pub fn u8(&mut self, v: u8) -> &mut Self {
        self.buf.push(v);
        self
    }

    /// A `bool` (one byte, 0 or 1).
    pub fn bool(&mut self, v: bool) -> &mut Self {
        self.u8(v as u8)
    }

    /// A `uint32`.
    pub fn u32(&mut self, v: u32) -> &mut Self {
        self.align(4);
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// An `int32`.
    pub fn i32(&mut self, v: i32) -> &mut Self {
        self.align(4);
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// A `float64`.
    pub fn f64(&mut self, v: f64) -> &mut Self {
        self.align(8);
        self.buf.extend_from_slice(&v.to_le_bytes());
        self
    }

    /// A `string`: length with the NUL, the bytes, the NUL.
    pub fn string(&mut self, s: &str) -> &mut Self {
        self.u32(s.len() as u32 + 1);
        self.buf.extend_from_slice(s.as_bytes());
        self.buf.push(0);
        self
    }

    /// The element count of a sequence (`T[]`); the elements follow.
    pub fn len(&mut self, n: usize) -> &mut Self {
        self.u32(n as u32)
    }

    /// A `float64[]` sequence.
    pub fn f64_seq(&mut self, v: impl ExactSizeIterator<Item = f64>) -> &mut Self {
        self.len(v.len());
        for x in v {
            self.f64(x);
        }
        self
    }

    /// A `float64[N]` fixed array.
    pub fn f64_array(&mut self, v: &[f64]) -> &mut Self {
        for &x in v {
            self.f64(x);
        }
        self
    }

    /// A `uint8[]` sequence.
    pub fn bytes_seq(&mut self, v: &[u8]) -> &mut Self {
        self.len(v.len());
        self.buf.extend_from_slice(v);
        self
    }
}

/// Why a CDR message did not decode.
#[derive(Debug, thiserror::Error, PartialEq)]
pub enum CdrError {
    /// Shorter than its fields.
    #[error("CDR message ends at byte {at} before its {what}")]
    Short {
        /// Offset reached, header included.
        at: usize,
        /// The field being read.
        what: &'static str,
    },
    /// Not little- or big-endian classic CDR.
    #[error("CDR encapsulation {0:02x?} is not classic CDR (00 00 or 00 01)")]
    Encapsulation([u8; 2]),
    /// A field's value is not one its type allows.
    #[error("CDR field {what}: {why}")]
    Value {
        /// The field.
        what: &'static str,
        /// What is wrong.
        why: String,
    },
}

/// Reads one CDR message, checking every length against what is left.
#[derive(Debug)]
pub struct Reader<'a> {
    buf: &'a [u8],
    pos: usize,
    little: bool,
}

impl<'a> Reader<'a> {
    /// Checks the header (both byte orders are read, as ROS 2 allows).
    pub fn new(buf: &'a [u8]) -> Result<Self, CdrError> {
        if buf.len() < 4 {
            return Err(CdrError::Short {
                at: buf.len(),
                what: "encapsulation header",
            });
        }
        let little = match [buf[0], buf[1]] {
            [0, 1] => true,
            [0, 0] => false,
            other => return Err(CdrError::Encapsulation(other)),
        };
        Ok(Reader {
            buf,
            pos: 4,
            little,
        })
    }

    fn take(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], CdrError> {
        let off = self.pos - HEADER_LE.len();
        let pad = (n - off % n) % n;
        if self.pos + pad > self.buf.len() {
            return Err(CdrError::Short { at: self.pos, what });
        }
        self.pos += pad;
        self.raw(n, what)
    }

    /// `n` bytes with no alignment (a string's or a byte sequence's contents).
    pub fn raw(&mut self, n: usize, what: &'static str) -> Result<&'a [u8], CdrError> {
        let end = self.pos.checked_add(n).filter(|&e| e <= self.buf.len());
        let Some(end) = end else {
            return Err(CdrError::Short { at: self.pos, what });
        };
        let s = &self.buf[self.pos..end];
        self.pos = end;
        Ok(s)
    }

    /// A `uint8`.
    pub fn u8(&mut self, what: &'static str) -> Result<u8, CdrError> {
        Ok(self.take(1, what)?[0])
    }

    /// A `bool`: 0 or 1, anything else refused.
    pub fn bool(&mut self, what: &'static str) -> Result<bool, CdrError> {
        match self.u8(what)? {
            0 => Ok(false),
            1 => Ok(true),
            v => Err(CdrError::Value {
                what,
                why: format!("{v} is not a bool"),
            }),
        }
    }

    /// A `uint32`.
    pub fn u32(&mut self, what: &'static str) -> Result<u32, CdrError> {
        let b: [u8; 4] = self.take(4, what)?.try_into().expect("4 bytes");
        Ok(if self.little {
            u32::from_le_bytes(b)
        } else {
            u32::from_be_bytes(b)
        })
    }

    /// An `int32`.
    pub fn i32(&mut self, what: &'static str) -> Result<i32, CdrError> {
        Ok(self.u32(what)? as i32)
    }

    /// A `float64`.
    pub fn f64(&mut self, what: &'static str) -> Result<f64, CdrError> {
        let b: [u8; 8] = self.take(8, what)?.try_into().expect("8 bytes");
        Ok(if self.little {
            f64::from_le_bytes(b)
        } else {
            f64::from_be_bytes(b)
        })
    }

    /// A `string` of at most `max` bytes, UTF-8, NUL-terminated.
    pub fn string(&mut self, what: &'static str, max: usize) -> Result<String, CdrError> {
        let n = self.u32(what)? as usize;
        if n == 0 || n > max + 1 {
            return Err(CdrError::Value {
                what,
                why: format!("string length {n} (with its NUL) outside 1..={}", max + 1),
            });
        }
        let b = self.raw(n, what)?;
        let (text, nul) = b.split_at(n - 1);
        if nul != [0] {
            return Err(CdrError::Value {
                what,
                why: "string without its terminating NUL".into(),
            });
        }
        String::from_utf8(text.to_vec()).map_err(|_| CdrError::Value {
            what,
            why: "string is not UTF-8".into(),
        })
    }

    /// Bytes left after the last field read (a well-formed message leaves at most 3: padding).
    pub fn left(&self) -> usize {
        self.buf.len() - self.pos
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn alignment_counts_from_the_end_of_the_header() {
        // rosbags' bytes for std_msgs/String{"hi"} and a u8 then an f64.
        let mut w = Writer::new();
        w.start().string("hi");
        assert_eq!(w.bytes(), [0, 1, 0, 0, 3, 0, 0, 0, b'h', b'i', 0]);
        w.start().u8(7).f64(1.5);
        let mut want = vec![0, 1, 0, 0, 7, 0, 0, 0, 0, 0, 0, 0];
        want.extend_from_slice(&1.5f64.to_le_bytes());
        assert_eq!(w.bytes(), want);
        let mut r = Reader::new(w.bytes()).unwrap();
        assert_eq!(r.u8("a").unwrap(), 7);
        assert_eq!(r.f64("b").unwrap(), 1.5);
        assert_eq!(r.left(), 0);
    }

    #[test]
    fn a_reader_refuses_short_messages_long_strings_and_bad_bools() {
        let mut w = Writer::new();
        w.start().string("robot");
        let b = w.bytes();
        assert!(matches!(
            Reader::new(&b[..b.len() - 1])
                .unwrap()
                .string("frame_id", 64),
            Err(CdrError::Short { .. })
        ));
        assert!(matches!(
            Reader::new(b).unwrap().string("frame_id", 3),
            Err(CdrError::Value { .. })
        ));
        assert_eq!(Reader::new(b).unwrap().string("f", 64).unwrap(), "robot");
        assert!(Reader::new(&[0, 1, 0, 0, 2]).unwrap().bool("data").is_err());
        assert!(matches!(
            Reader::new(&[0, 7, 0, 0, 1]),
            Err(CdrError::Encapsulation(_))
        ));
        // Big-endian classic CDR reads too.
        let mut r = Reader::new(&[0, 0, 0, 0, 0, 0, 0, 5]).unwrap();
        assert_eq!(r.u32("n").unwrap(), 5);
    }
}
