//! The protobuf wire format: varints, length-delimited values and the keys in front of them.

use crate::error::Error;

pub(super) fn malformed() -> Error {
    Error::bad_request("the object provided is unrecognized: malformed protobuf message")
}

/// A protobuf reader over one message's bytes.
pub(super) struct Reader<'a>(pub(super) &'a [u8]);

/// One field's value as it is on the wire.
pub(super) enum Raw<'a> {
    Varint(u64),
    Bytes(&'a [u8]),
    /// A fixed-width value: no Kubernetes type we decode has one.
    Skipped,
}

impl<'a> Reader<'a> {
    pub(super) fn is_empty(&self) -> bool {
        self.0.is_empty()
    }

    fn varint(&mut self) -> Result<u64, Error> {
        let mut v = 0u64;
        for shift in (0..64).step_by(7) {
            let (&b, rest) = self.0.split_first().ok_or_else(malformed)?;
            self.0 = rest;
            v |= u64::from(b & 0x7f) << shift;
            if b < 0x80 {
                return Ok(v);
            }
        }
        Err(malformed())
    }

    fn take(&mut self, n: usize) -> Result<&'a [u8], Error> {
        if n > self.0.len() {
            return Err(malformed());
        }
        let (head, rest) = self.0.split_at(n);
        self.0 = rest;
        Ok(head)
    }

    /// The next field: its number and either a varint or the bytes of a length-delimited
    /// value (fixed-width values are skipped).
    pub(super) fn field(&mut self) -> Result<(u32, Raw<'a>), Error> {
        let key = self.varint()?;
        let num = u32::try_from(key >> 3).map_err(|_| malformed())?;
        let raw = match key & 7 {
            0 => Raw::Varint(self.varint()?),
            1 => self.take(8).map(|_| Raw::Skipped)?,
            2 => {
                let n = usize::try_from(self.varint()?).map_err(|_| malformed())?;
                Raw::Bytes(self.take(n)?)
            }
            5 => self.take(4).map(|_| Raw::Skipped)?,
            _ => return Err(malformed()),
        };
        Ok((num, raw))
    }
}
