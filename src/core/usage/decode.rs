//! A response body's content coding undone as it streams through, so that the usage scanner
//! reads a compressed body as it reads a plain one. Pure: the filter picks the `Coding` from the
//! response's `content-encoding`, hands each chunk to a `Decoder`, which passes the decoded bytes
//! on as they come (never waiting for the end: a compressed event stream is read event by event)
//! and keeps none of them, and asks `finish` at the end whether the body ended whole.
//!
//! **What is decoded.** `gzip` (and its old name `x-gzip`), one member or several in a row;
//! `deflate`, as RFC 9110 defines it (a zlib stream), or the raw deflate some servers send under
//! that name (told apart by the first two bytes, as browsers do). `identity`, or no header, is
//! passed through. Anything else (`br`, `zstd`, two codings stacked) is `Unsupported`: its usage
//! cannot be read. `narrow_accept_encoding` keeps a request's `accept-encoding` to what is here.
//!
//! **Why memory is bounded.** The inflater's state and its 32 KiB window (about 40 KiB, allocated
//! when the first compressed byte comes, freed when the body ends or fails), and an 8 KiB output
//! buffer on the stack while a chunk is decoded. The decoded bytes of a chunk are handed on piece
//! by piece, however much a chunk expands, and at most `MAX_DECODED` in all: past it a body is
//! `TooLarge` (a few hundred KiB of gzip can expand to that; decoding more is only work).

use zlib_rs::{Inflate, InflateFlush, Status};

/// The most a compressed body is decoded to: far more than any usage-bearing answer.
pub const MAX_DECODED: u64 = 256 << 20;

/// Decoded bytes are handed on in pieces of at most this many.
const PIECE: usize = 8 << 10;

/// A content coding that sluice can undo.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Coding {
    Identity,
    Gzip,
    Deflate,
}

/// A `content-encoding` that sluice cannot undo.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Unsupported;

impl Coding {
    /// The coding a response with this `content-encoding` (`None`: without one) has: `Unsupported`
    /// for an unknown coding, or more than one (a header repeated, or a list, "gzip, gzip").
    /// Names are matched ignoring case; `identity` and empty list items change nothing.
    pub fn of_content_encoding(value: Option<&[u8]>) -> Result<Coding, Unsupported> {
        let mut coding = Coding::Identity;
        for item in value.unwrap_or_default().split(|&b| b == b',') {
            let name = item.trim_ascii();
            if name.is_empty() || name.eq_ignore_ascii_case(b"identity") {
                continue;
            }
            let named = Coding::named(name).ok_or(Unsupported)?;
            if coding != Coding::Identity {
                return Err(Unsupported);
            }
            coding = named;
        }
        Ok(coding)
    }

    /// The coding `name` names, `identity` included.
    fn named(name: &[u8]) -> Option<Coding> {
        let is = |known: &[u8]| name.eq_ignore_ascii_case(known);
        if is(b"gzip") || is(b"x-gzip") {
            Some(Coding::Gzip)
        } else if is(b"deflate") {
            Some(Coding::Deflate)
        } else if is(b"identity") {
            Some(Coding::Identity)
        } else {
            None
        }
    }
}

/// Why a compressed body could not be decoded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Error {
    /// Not what its coding says: a bad header, block or checksum, or bytes after its end.
    Corrupt,
    /// It ended inside a compressed stream.
    Truncated,
    /// It decodes to more than `MAX_DECODED`.
    TooLarge,
}

impl Error {
    pub fn as_str(self) -> &'static str {
        match self {
            Error::Corrupt => "corrupt",
            Error::Truncated => "truncated",
            Error::TooLarge => "too_large",
        }
    }

    /// Why, as a `Reading::Invalid` says it.
    pub fn reason(self) -> &'static str {
        match self {
            Error::Corrupt => "corrupt compressed body",
            Error::Truncated => "compressed body cut short",
            Error::TooLarge => "compressed body too large",
        }
    }
}

/// Undoes one body's content coding, chunk by chunk, in any chunking.
pub struct Decoder {
    coding: Coding,
    state: State,
    /// Decoded bytes handed on so far.
    decoded: u64,
    /// The most it decodes: `MAX_DECODED` (less in tests).
    limit: u64,
}

enum State {
    /// No byte yet, or a gzip member just ended: the next byte starts a new member.
    Idle,
    /// Deflate's first byte, which with the second tells a zlib stream from raw deflate.
    FirstByte(u8),
    Inflating(Inflate),
    /// A zlib or raw deflate stream ended: nothing may follow.
    Ended,
    Failed(Error),
}

impl std::fmt::Debug for Decoder {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let state = match &self.state {
            State::Idle => "idle",
            State::FirstByte(_) => "first byte",
            State::Inflating(_) => "inflating",
            State::Ended => "ended",
            State::Failed(error) => error.as_str(),
        };
        f.debug_struct("Decoder")
            .field("coding", &self.coding)
            .field("state", &state)
            .field("decoded", &self.decoded)
            .finish()
    }
}

impl Decoder {
    pub fn new(coding: Coding) -> Decoder {
        Decoder {
            coding,
            state: State::Idle,
            decoded: 0,
            limit: MAX_DECODED,
        }
    }

    /// Decodes the next chunk, handing what it decodes to `emit` as it goes (in pieces of at most
    /// 8 KiB). After an error, every call returns it again and decodes nothing.
    pub fn feed(&mut self, chunk: &[u8], emit: &mut impl FnMut(&[u8])) -> Result<(), Error> {
        if self.coding == Coding::Identity {
            if let State::Failed(error) = self.state {
                return Err(error);
            }
            emit(chunk);
            return Ok(());
        }
        let fed = self.inflate(chunk, emit);
        if let Err(error) = fed {
            // Frees the inflater.
            self.state = State::Failed(error);
        }
        fed
    }

    /// Whether what was fed is a whole body: empty (a response without a body), or every stream
    /// begun has ended. `Truncated` when it stopped inside one.
    pub fn finish(&self) -> Result<(), Error> {
        match self.state {
            State::Idle | State::Ended => Ok(()),
            State::FirstByte(_) | State::Inflating(_) => Err(Error::Truncated),
            State::Failed(error) => Err(error),
        }
    }

    fn inflate(&mut self, chunk: &[u8], emit: &mut impl FnMut(&[u8])) -> Result<(), Error> {
        let mut input = chunk;
        let mut out = [0u8; PIECE];
        loop {
            match self.state {
                State::Failed(error) => return Err(error),
                State::Ended if input.is_empty() => return Ok(()),
                State::Ended => return Err(Error::Corrupt),
                State::Idle => {
                    let Some((&first, rest)) = input.split_first() else {
                        return Ok(());
                    };
                    self.state = match self.coding {
                        Coding::Deflate => {
                            input = rest;
                            State::FirstByte(first)
                        }
                        // 16 + 15: a gzip header, then a deflate stream with a window of up to
                        // 32 KiB.
                        _ => State::Inflating(Inflate::new(true, 16 + 15)),
                    };
                    continue;
                }
                State::FirstByte(first) => {
                    let Some(&second) = input.first() else {
                        return Ok(());
                    };
                    let inflate = Inflate::new(is_zlib_header(first, second), 15);
                    self.state = State::Inflating(inflate);
                    // The first byte alone decodes to nothing, nor ends the stream.
                    if self.inflate_some(&[first], &mut out, emit)?.is_some() {
                        return Err(Error::Corrupt);
                    }
                }
                State::Inflating(_) => {}
            }
            match self.inflate_some(input, &mut out, emit)? {
                // The stream ended with bytes to spare: a next gzip member, or an error.
                Some(rest) => {
                    self.state = match self.coding {
                        Coding::Gzip => State::Idle,
                        _ => State::Ended,
                    };
                    input = rest;
                }
                None => return Ok(()),
            }
        }
    }

    /// Runs the inflater over `input` until it is all taken and no output is left, handing each
    /// piece to `emit`; `Some(rest)` when the stream ended, with the bytes after it.
    fn inflate_some<'i>(
        &mut self,
        mut input: &'i [u8],
        out: &mut [u8; PIECE],
        emit: &mut impl FnMut(&[u8]),
    ) -> Result<Option<&'i [u8]>, Error> {
        let State::Inflating(inflate) = &mut self.state else {
            return Ok(Some(input));
        };
        loop {
            let (taken_before, made_before) = (inflate.total_in(), inflate.total_out());
            let status = inflate
                .decompress(input, out, InflateFlush::NoFlush)
                .map_err(|_| Error::Corrupt)?;
            let taken = inflate.total_in().saturating_sub(taken_before);
            let made = inflate.total_out().saturating_sub(made_before);
            self.decoded = self.decoded.saturating_add(made);
            if self.decoded > self.limit {
                return Err(Error::TooLarge);
            }
            let made = usize::try_from(made).unwrap_or(usize::MAX);
            if made > 0 {
                emit(out.get(..made).unwrap_or_default());
            }
            input = input
                .get(usize::try_from(taken).unwrap_or(usize::MAX)..)
                .unwrap_or_default();
            if status == Status::StreamEnd {
                return Ok(Some(input));
            }
            // The output had room: all that the input gives has come. Without progress, more
            // input is needed.
            let drained = made < out.len() && input.is_empty();
            if drained || (taken == 0 && made == 0) {
                return Ok(None);
            }
        }
    }
}

/// Whether two bytes start a zlib stream (RFC 1950: deflate, a window of at most 32 KiB, a
/// header check that is a multiple of 31), rather than raw deflate.
fn is_zlib_header(cmf: u8, flg: u8) -> bool {
    cmf & 0x0f == 8 && cmf >> 4 <= 7 && (u16::from(cmf) << 8 | u16::from(flg)) % 31 == 0
}

/// A request's `accept-encoding` with only the codings sluice decodes (`gzip`, `x-gzip`,
/// `deflate`, `identity`), each kept as written with its parameters (`gzip;q=0.5`), in order,
/// joined by ", "; `None` when none is left (then the header goes, and the answer comes as
/// identity). `*` goes too: it would let the upstream pick any coding.
pub fn narrow_accept_encoding(value: &[u8]) -> Option<Vec<u8>> {
    let mut kept = Vec::with_capacity(value.len());
    for item in value.split(|&b| b == b',') {
        let item = item.trim_ascii();
        let name = item.split(|&b| b == b';').next().unwrap_or_default();
        if Coding::named(name.trim_ascii()).is_none() {
            continue;
        }
        if !kept.is_empty() {
            kept.extend_from_slice(b", ");
        }
        kept.extend_from_slice(item);
    }
    (!kept.is_empty()).then_some(kept)
}

#[cfg(test)]
mod tests;
