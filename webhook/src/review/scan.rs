//! The fast reading of a review: one hand-written pass over the whole body ([`parse_text`]) that
//! checks it as strictly as serde_json would, reads the envelope's few members the review uses,
//! and leaves the request's objects as text in place, checked (depth, shape, `metadata`) and
//! with what defaulting and the rules read picked out, so the happy path builds no
//! `serde_json::Value` tree and reads no byte twice. It exists for speed (the `handler` bench and
//! `webhook/bench/run.sh` measure it); it may leave any body to the reference reading
//! ([`parse`](super::wire::parse)), and for every body it accepts it must answer as that does,
//! which the tests check (tables, and property tests that edit reviews byte by byte).

use k8s_openapi::api::authentication::v1::UserInfo;
use kube::core::admission::Operation as WireOperation;
use std::borrow::Cow;

use serde_json::Value;
use smolvm_api::defaulting::{Finalizers, Shape, SpecText};

use super::wire::*;

/// serde_json's nesting limit: reading a body fails on entering the 128th nested array or object.
const JSON_DEPTH_LIMIT: u32 = 128;
/// How deep `request.object` and `request.oldObject` sit in a review (the review's own object
/// and `request`).
const OBJECT_DEPTH: u32 = 2;

/// What kind of JSON value something is.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Kind {
    Null,
    Scalar,
    Array,
    Object,
}

fn kind_at(byte: u8) -> Kind {
    match byte {
        b'{' => Kind::Object,
        b'[' => Kind::Array,
        b'n' => Kind::Null,
        _ => Kind::Scalar,
    }
}

/// The four hex digits at `b[at..]` (digits only: no sign, as JSON has none).
fn hex4(b: &[u8], at: usize) -> Option<u16> {
    let digits = b.get(at..at + 4)?;
    let mut n = 0u16;
    for &d in digits {
        n = n << 4 | u16::from(char::from(d).to_digit(16)? as u8);
    }
    Some(n)
}

/// The index of the first byte at or after `i` that a string cannot hold as it is: a quote, a
/// backslash or a control character (below 0x20). Eight bytes at a time: for each of the three
/// tests, `(x - 0x01..) & !x & 0x80..` marks a byte that matched, and the lowest mark is exact.
#[inline(always)]
fn string_stop(b: &[u8], mut i: usize) -> Option<usize> {
    const ONES: u64 = 0x0101_0101_0101_0101;
    const HIGH: u64 = 0x8080_8080_8080_8080;
    while let Some(chunk) = b.get(i..).and_then(<[u8]>::first_chunk::<8>) {
        let x = u64::from_le_bytes(*chunk);
        let quote = x ^ (ONES * u64::from(b'"'));
        let backslash = x ^ (ONES * u64::from(b'\\'));
        let marks = (quote.wrapping_sub(ONES) & !quote)
            | (backslash.wrapping_sub(ONES) & !backslash)
            | (x.wrapping_sub(ONES * 0x20) & !x);
        let marks = marks & HIGH;
        if marks != 0 {
            return Some(i + (marks.trailing_zeros() / 8) as usize);
        }
        i += 8;
    }
    b.get(i..)?
        .iter()
        .position(|&c| c == b'"' || c == b'\\' || c < 0x20)
        .map(|n| i + n)
}

/// The end (index of the closing quote) of the string whose content starts at `b[start..]`,
/// and whether it has escapes; `None` for a string JSON refuses (a control character, an
/// unknown escape, an unterminated string), and for `\u` escapes not paired the way a
/// `serde_json::Value` read requires (a trailing surrogate alone, or a leading one not followed
/// by `\u` and a trailing one).
#[inline(always)]
fn scan_string(b: &[u8], start: usize) -> Option<(usize, bool)> {
    let mut i = start;
    let mut escaped = false;
    loop {
        i = string_stop(b, i)?;
        match b[i] {
            b'"' => return Some((i, escaped)),
            b'\\' => escaped = true,
            _ => return None,
        }
        match *b.get(i + 1)? {
            b'"' | b'\\' | b'/' | b'b' | b'f' | b'n' | b'r' | b't' => {
                i += 2;
                continue;
            }
            b'u' => {}
            _ => return None,
        }
        let n = hex4(b, i + 2)?;
        i += 6;
        if (0xDC00..=0xDFFF).contains(&n) {
            return None;
        }
        if (0xD800..=0xDBFF).contains(&n) {
            if b.get(i..i + 2) != Some(b"\\u") {
                return None;
            }
            let n2 = hex4(b, i + 2)?;
            if !(0xDC00..=0xDFFF).contains(&n2) {
                return None;
            }
            i += 6;
        }
    }
}

/// [`skip_ws`], with the common case (no whitespace) first.
#[inline(always)]
fn ws(b: &[u8], i: usize) -> usize {
    match b.get(i) {
        Some(&c) if c > b' ' => i,
        _ => skip_ws(b, i),
    }
}

/// The index of the first byte at or after `i` that is not JSON whitespace.
fn skip_ws(b: &[u8], mut i: usize) -> usize {
    while let Some(&c) = b.get(i) {
        if c == b' ' || c == b'\n' || c == b'\r' || c == b'\t' {
            i += 1;
        } else {
            break;
        }
    }
    i
}

/// What [`scan_value`] learns about an object.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Scanned<'a> {
    /// The kind of the whole value.
    kind: Kind,
    /// The kind of its last `metadata` member, if any.
    metadata: Option<Kind>,
    /// The text of its last `spec` member.
    pub(super) spec: Option<&'a str>,
    /// The text of the last `deletionTimestamp` member of the last `metadata`, if an object.
    deletion_timestamp: Option<&'a str>,
    /// The text of the last `finalizers` member of the last `metadata`, if an object.
    finalizers: Option<&'a str>,
    /// Spans of `metadata` members the rules never read, in order, each with the text that
    /// reads the same to them ([`Scanned::slimmed`]); the first [`MAX_CUTS`].
    cuts: [(u32, u32, Cut); MAX_CUTS],
    /// How many of `cuts` are set.
    n_cuts: usize,
}

/// What [`Scanned::slimmed`] puts in place of a span it leaves out.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Cut {
    Null,
    EmptyObject,
}

impl Cut {
    fn text(self) -> &'static str {
        match self {
            Cut::Null => "null",
            Cut::EmptyObject => "{}",
        }
    }
}

/// Most spans [`Scanned::slimmed`] leaves out (an object has one `managedFields` and one
/// `annotations`; repeats beyond are left in).
const MAX_CUTS: usize = 4;

/// The key prefix of the only annotations the rules read (`vm.smolvm.dev/`).
const RULE_ANNOTATION_PREFIX: &[u8] = b"vm.smolvm.dev/";

impl Scanned<'_> {
    /// The object's text with what the rules never read left out, when there is any: each
    /// `metadata.managedFields` is `null`, and an `annotations` object whose values are all
    /// strings and whose keys are plain (no escapes) and none under [`RULE_ANNOTATION_PREFIX`] is
    /// `{}`. The rules decode their metadata with those annotations checked to be strings and
    /// dropped, and without `managedFields`, so they find the same in both texts, and the same
    /// as on the Value of either; kubectl's last-applied-configuration annotation (the object
    /// again, escaped) and the managed fields are then not read a second time.
    pub(super) fn slimmed(&self, text: &str) -> Option<String> {
        let cuts = self.cuts.get(..self.n_cuts)?;
        if cuts.is_empty() {
            return None;
        }
        let mut out = String::with_capacity(text.len());
        let mut at = 0;
        for &(start, end, with) in cuts {
            out.push_str(text.get(at..start as usize)?);
            out.push_str(with.text());
            at = end as usize;
        }
        out.push_str(text.get(at..)?);
        Some(out)
    }
}

/// A member the scan keeps, by its key.
#[derive(Clone, Copy, PartialEq, Eq)]
enum Member {
    Spec,
    Metadata,
    DeletionTimestamp,
    Finalizers,
    ManagedFields,
    Annotations,
    Other,
}

/// Reads the JSON value at `text[start..]` (whitespace before it allowed) as serde_json reads
/// a value `base` containers deep in a document: strictly by JSON's grammar, with serde_json's
/// nesting limit, `\u` surrogates paired and numbers within an f64's range, as a
/// `serde_json::Value` read requires. Returns where the value ends and, when it is an object,
/// where the members the rules read are (later repeats of a key win, as in a Value). `None`
/// when such a read would fail, and when a key of the object or of its `metadata` has escapes
/// (not worth decoding here; the Value path handles it).
///
/// Each turn of the loop reads a value, then what may follow a value: `,` (and in an object the
/// next key and its `:`) or the end of the containers it closes.
fn scan_value(text: &str, start: usize, base: u32) -> Option<(usize, Scanned<'_>)> {
    let b = text.as_bytes();
    let mut i = skip_ws(b, start);
    let mut scan = Scan::new(text, kind_at(*b.get(i)?), base, i);
    loop {
        // A value starts at `i`. (An if-chain in order of frequency: a `match` here compiles to
        // a jump table whose indirect branch mispredicts on almost every value.)
        let c = *b.get(i)?;
        if c == b'"' {
            let (end, _) = scan_string(b, i + 1)?;
            i = scan.value(c, i, end + 1, false)?;
        } else if c == b'{' || c == b'[' {
            i = ws(b, scan.value(c, i, i + 1, true)?);
            let first = *b.get(i)?;
            if c == b'{' && first != b'}' {
                i = scan.member_key(i)?;
                continue;
            }
            if c == b'[' && first != b']' {
                continue;
            }
            // Empty.
            scan.depth -= 1;
            scan.close(scan.depth, i + 1);
            i += 1;
        } else if c.is_ascii_digit() || c == b'-' {
            i = scan.value(c, i, number_end(text, i)?, false)?;
        } else {
            let word: &[u8] = match c {
                b't' => b"true",
                b'f' => b"false",
                b'n' => b"null",
                _ => return None,
            };
            if b.get(i..i + word.len()) != Some(word) {
                return None;
            }
            i = scan.value(c, i, i + word.len(), false)?;
        }
        // A value ended at `i`: the next one of its container, or the ends of containers.
        loop {
            if scan.depth == 0 {
                return Some((i, scan.out));
            }
            i = ws(b, i);
            let c = *b.get(i)?;
            let object = scan.in_object();
            if c == b',' {
                i = ws(b, i + 1);
                if object {
                    i = scan.member_key(i)?;
                }
                break;
            }
            if c != if object { b'}' } else { b']' } {
                return None;
            }
            scan.depth -= 1;
            scan.close(scan.depth, i + 1);
            i += 1;
        }
    }
}

/// [`scan_value`] of a request's object, given alone as `text`: the whole text is one value
/// (the tests' reading of an object on its own).
#[cfg(test)]
pub(super) fn scan_object(text: &str) -> Option<Scanned<'_>> {
    let (end, scanned) = scan_value(text, 0, OBJECT_DEPTH)?;
    (skip_ws(text.as_bytes(), end) == text.len()).then_some(scanned)
}

/// The end of the number at `text[i..]`, by JSON's grammar; `None` for one JSON refuses, or one
/// a Value read refuses (out of an f64's range).
fn number_end(text: &str, i: usize) -> Option<usize> {
    let b = text.as_bytes();
    let digits = |mut j: usize| {
        while b.get(j).is_some_and(u8::is_ascii_digit) {
            j += 1;
        }
        j
    };
    let mut j = i + usize::from(b.get(i) == Some(&b'-'));
    j = match b.get(j)? {
        b'0' => j + 1,
        b'1'..=b'9' => digits(j + 1),
        _ => return None,
    };
    let integer_end = j;
    if b.get(j) == Some(&b'.') {
        let end = digits(j + 1);
        if end == j + 1 {
            return None;
        }
        j = end;
    }
    if matches!(b.get(j), Some(b'e' | b'E')) {
        j += 1;
        if matches!(b.get(j), Some(b'+' | b'-')) {
            j += 1;
        }
        let end = digits(j);
        if end == j {
            return None;
        }
        j = end;
    }
    // A plain integer of up to 19 characters is a u64 or an i64; anything else may be an f64
    // out of range, which only serde_json itself can tell.
    let plain = j == integer_end && j - i < 20;
    if !plain && serde_json::from_str::<Value>(text.get(i..j)?).is_err() {
        return None;
    }
    Some(j)
}

/// The state of [`scan_value`] between two tokens.
struct Scan<'a> {
    text: &'a str,
    out: Scanned<'a>,
    /// Where the value read starts in `text` (its cuts are counted from there).
    origin: usize,
    /// How deep the value read sits in its document.
    base: u32,
    /// Containers open around the current position.
    depth: u32,
    /// Which of them are objects (bit `d` for the container at depth `d`).
    objects: u128,
    /// Inside the current `metadata` object.
    in_metadata: bool,
    /// Inside an `annotations` object of the current `metadata`, and whether it may be cut.
    in_annotations: bool,
    annotations_cuttable: bool,
    /// A key the scan keeps was just read: the next value is its member's.
    expect_value: bool,
    /// The member at depth 1 and where its value starts.
    key1: Member,
    start1: Option<usize>,
    /// The member of metadata (depth 2) and where its value starts.
    key2: Member,
    start2: Option<usize>,
}

impl<'a> Scan<'a> {
    fn new(text: &'a str, kind: Kind, base: u32, origin: usize) -> Self {
        Scan {
            text,
            origin,
            out: Scanned {
                kind,
                metadata: None,
                spec: None,
                deletion_timestamp: None,
                finalizers: None,
                cuts: [(0, 0, Cut::Null); MAX_CUTS],
                n_cuts: 0,
            },
            base,
            depth: 0,
            objects: 0,
            in_metadata: false,
            in_annotations: false,
            annotations_cuttable: false,
            expect_value: false,
            key1: Member::Other,
            start1: None,
            key2: Member::Other,
            start2: None,
        }
    }

    /// Whether the container open here is an object.
    fn in_object(&self) -> bool {
        self.objects >> self.depth & 1 == 1
    }

    /// Whether the keys of the object open here are read: the object's, its metadata's and
    /// its metadata's annotations'.
    fn keys_here(&self) -> bool {
        self.depth == 1 || (self.depth == 2 && self.in_metadata) || (self.depth == 3 && self.in_annotations)
    }

    /// The key at `i` of the object open here, and its `:`; where its value starts.
    #[inline(always)]
    fn member_key(&mut self, i: usize) -> Option<usize> {
        let b = self.text.as_bytes();
        if *b.get(i)? != b'"' {
            return None;
        }
        let (end, escaped) = scan_string(b, i + 1)?;
        if self.keys_here() {
            self.key(i, end, escaped)?;
        }
        let i = ws(b, end + 1);
        if *b.get(i)? != b':' {
            return None;
        }
        Some(ws(b, i + 1))
    }

    /// The key `text[i + 1..end]` (`escaped` if it has escapes) of the object open here, one
    /// whose keys the scan reads ([`Scan::keys_here`]).
    fn key(&mut self, i: usize, end: usize, escaped: bool) -> Option<()> {
        let key = &self.text.as_bytes()[i + 1..end];
        self.expect_value = true;
        if self.depth == 3 {
            // An annotation's key: one the rules may read (or that may decode to one) keeps the
            // annotations in.
            if escaped || key.starts_with(RULE_ANNOTATION_PREFIX) {
                self.annotations_cuttable = false;
            }
            return Some(());
        }
        if escaped {
            return None;
        }
        if self.depth == 1 {
            self.key1 = match key {
                b"spec" => Member::Spec,
                b"metadata" => Member::Metadata,
                _ => Member::Other,
            };
        } else {
            self.key2 = match key {
                b"deletionTimestamp" => Member::DeletionTimestamp,
                b"finalizers" => Member::Finalizers,
                b"managedFields" => Member::ManagedFields,
                b"annotations" => Member::Annotations,
                _ => Member::Other,
            };
        }
        Some(())
    }

    /// A value starting at `i` with byte `c`: a scalar ending at `next`, or a container that
    /// `opens` there. Where the scan goes on; `None` past the nesting limit.
    #[inline(always)]
    fn value(&mut self, c: u8, i: usize, next: usize, opens: bool) -> Option<usize> {
        if self.expect_value {
            self.expect_value = false;
            if self.depth == 1 {
                self.start1 = Some(i);
                if self.key1 == Member::Metadata {
                    // This metadata replaces any earlier one, members and all.
                    self.out.metadata = Some(kind_at(c));
                    self.out.deletion_timestamp = None;
                    self.out.finalizers = None;
                    self.in_metadata = c == b'{';
                }
            } else if self.depth == 2 && self.in_metadata {
                self.start2 = Some(i);
                if self.key2 == Member::Annotations && c == b'{' {
                    self.in_annotations = true;
                    self.annotations_cuttable = true;
                }
            } else if self.depth == 3 && self.in_annotations && c != b'"' {
                // An annotation that is not a string: the rules' decoding reports it.
                self.annotations_cuttable = false;
            }
        }
        if opens {
            self.depth += 1;
            if self.base + self.depth >= JSON_DEPTH_LIMIT {
                return None;
            }
            if c == b'{' {
                self.objects |= 1 << self.depth;
            } else {
                self.objects &= !(1 << self.depth);
            }
        } else {
            self.close(self.depth, next);
        }
        Some(next)
    }

    /// A value at `depth` ended at `end`: note it if it is a member the scan keeps.
    #[inline(always)]
    fn close(&mut self, depth: u32, end: usize) {
        if depth == 1
            && let Some(start) = self.start1.take()
        {
            match self.key1 {
                Member::Spec => self.out.spec = self.text.get(start..end),
                Member::Metadata => self.in_metadata = false,
                _ => {}
            }
        } else if depth == 2
            && self.in_metadata
            && let Some(start) = self.start2.take()
        {
            match self.key2 {
                Member::DeletionTimestamp => self.out.deletion_timestamp = self.text.get(start..end),
                Member::Finalizers => self.out.finalizers = self.text.get(start..end),
                Member::ManagedFields => self.cut(start, end, Cut::Null),
                Member::Annotations => {
                    if self.in_annotations && self.annotations_cuttable {
                        self.cut(start, end, Cut::EmptyObject);
                    }
                    self.in_annotations = false;
                }
                _ => {}
            }
        }
    }

    /// Leaves `text[start..end]` out of [`Scanned::slimmed`] (of the value's own text), `with`
    /// in its place (not past [`MAX_CUTS`], nor past 4 GiB of text).
    fn cut(&mut self, start: usize, end: usize, with: Cut) {
        let from_origin = |at: usize| at.checked_sub(self.origin).and_then(|n| u32::try_from(n).ok());
        let (Some(start), Some(end)) = (from_origin(start), from_origin(end)) else {
            return;
        };
        if let Some(slot) = self.out.cuts.get_mut(self.out.n_cuts) {
            *slot = (start, end, with);
            self.out.n_cuts += 1;
        }
    }
}

/// A request read from a review's text by [`parse_text`]: what [`parse`] reads of it, with the
/// objects left as text (borrowed from the body), each with its scan.
pub(super) struct TextRequest<'a> {
    pub(super) uid: String,
    pub(super) group: String,
    pub(super) resource: String,
    pub(super) sub_resource: Option<String>,
    pub(super) operation: WireOperation,
    pub(super) user_info: UserInfo,
    pub(super) object: Option<(&'a str, Scanned<'a>)>,
    pub(super) old_object: Option<(&'a str, Scanned<'a>)>,
}

/// The request of `body`, when [`parse`] would accept `body` and read the same of it; `None`
/// for anything else (then [`parse`] decides).
///
/// One pass over the body, for speed (a review's objects are most of it, and serde_json would
/// read them once to find where they end and the scan once more). It reads strictly: the
/// body is UTF-8 and one JSON value, the envelope's members are read as `WireReview` and
/// `WireRequest` read them (a repeated member, a missing or mistyped one, or a key with escapes
/// is left to [`parse`]), the members it skips are checked as serde_json checks what it
/// ignores, and the objects as a `serde_json::Value` read checks them ([`scan_value`]).
pub(super) fn parse_text(body: &[u8]) -> Option<TextRequest<'_>> {
    let text = std::str::from_utf8(body).ok()?;
    let mut r = Envelope { text, i: 0 };
    let (mut api_version, mut kind, mut request) = (None, None, None);
    r.object(|r, key| match key {
        b"apiVersion" => once(&mut api_version, r.text()),
        b"kind" => once(&mut kind, r.text()),
        b"request" => once(&mut request, r.request()),
        _ => r.skip(1),
    })?;
    if skip_ws(text.as_bytes(), r.i) != text.len() || api_version? != ADMISSION_API_VERSION || kind? != ADMISSION_KIND {
        return None;
    }
    request
}

/// Sets `slot` to `value` the first time; `None` for a second time (a struct's member named
/// twice, which serde refuses) or no value.
fn once<T>(slot: &mut Option<T>, value: Option<T>) -> Option<()> {
    if slot.is_some() {
        return None;
    }
    *slot = Some(value?);
    Some(())
}

/// [`parse_text`]'s position in the body.
struct Envelope<'a> {
    text: &'a str,
    i: usize,
}

impl<'a> Envelope<'a> {
    /// The next byte that is not whitespace, which the reader is then at.
    fn peek(&mut self) -> Option<u8> {
        self.i = skip_ws(self.text.as_bytes(), self.i);
        self.text.as_bytes().get(self.i).copied()
    }

    /// Reads `c`, or `None`.
    fn eat(&mut self, c: u8) -> Option<()> {
        (self.peek()? == c).then(|| self.i += 1)
    }

    /// Reads `null` if it is next.
    fn null(&mut self) -> bool {
        let null = self.peek() == Some(b'n') && self.text.as_bytes().get(self.i..self.i + 4) == Some(b"null");
        if null {
            self.i += 4;
        }
        null
    }

    /// `None` for `null`, else what `read` reads.
    fn nullable<T>(&mut self, read: impl FnOnce(&mut Self) -> Option<T>) -> Option<Option<T>> {
        if self.null() { Some(None) } else { read(self).map(Some) }
    }

    /// The object next, each member given to `member` with its key (with no escapes) and the
    /// reader at its value.
    fn object(&mut self, mut member: impl FnMut(&mut Self, &'a [u8]) -> Option<()>) -> Option<()> {
        self.eat(b'{')?;
        if self.peek()? == b'}' {
            self.i += 1;
            return Some(());
        }
        let b = self.text.as_bytes();
        loop {
            if self.peek()? != b'"' {
                return None;
            }
            let (end, escaped) = scan_string(b, self.i + 1)?;
            if escaped {
                return None;
            }
            let key = &b[self.i + 1..end];
            self.i = end + 1;
            self.eat(b':')?;
            member(self, key)?;
            match self.peek()? {
                b',' => self.i += 1,
                b'}' => {
                    self.i += 1;
                    return Some(());
                }
                _ => return None,
            }
        }
    }

    /// The string next, unescaped (borrowed from the body when it has no escapes).
    fn text(&mut self) -> Option<Cow<'a, str>> {
        if self.peek()? != b'"' {
            return None;
        }
        let (end, escaped) = scan_string(self.text.as_bytes(), self.i + 1)?;
        let quoted = self.text.get(self.i..=end)?;
        self.i = end + 1;
        if escaped {
            serde_json::from_str(quoted).ok().map(Cow::Owned)
        } else {
            quoted.get(1..quoted.len() - 1).map(Cow::Borrowed)
        }
    }

    /// The string next, unescaped.
    fn string(&mut self) -> Option<String> {
        self.text().map(Cow::into_owned)
    }

    /// The array of strings next.
    fn strings(&mut self) -> Option<Vec<String>> {
        self.eat(b'[')?;
        let mut out = Vec::new();
        if self.peek()? == b']' {
            self.i += 1;
            return Some(out);
        }
        loop {
            out.push(self.string()?);
            match self.peek()? {
                b',' => self.i += 1,
                b']' => {
                    self.i += 1;
                    return Some(out);
                }
                _ => return None,
            }
        }
    }

    /// Skips the value next, a member of an object `depth` containers deep, checked as
    /// serde_json checks a value it ignores (and as a Value read would: stricter, never laxer).
    fn skip(&mut self, depth: u32) -> Option<()> {
        let (end, _) = scan_value(self.text, self.i, depth)?;
        self.i = end;
        Some(())
    }

    /// The review's `request`, read as [`WireRequest`] reads it.
    fn request(&mut self) -> Option<TextRequest<'a>> {
        let (mut uid, mut resource, mut sub_resource, mut operation) = (None, None, None, None);
        let (mut user_info, mut object, mut old_object) = (None, None, None);
        self.object(|r, key| match key {
            b"uid" => once(&mut uid, r.string()),
            b"resource" => once(&mut resource, r.resource()),
            b"subResource" => once(&mut sub_resource, r.nullable(Self::string)),
            b"operation" => once(&mut operation, r.text().and_then(|s| wire_operation(&s))),
            b"userInfo" => once(&mut user_info, r.user_info()),
            b"object" => once(&mut object, r.nullable(Self::kube_object)),
            b"oldObject" => once(&mut old_object, r.nullable(Self::kube_object)),
            _ => r.skip(2),
        })?;
        let (group, resource) = resource?;
        Some(TextRequest {
            uid: uid?,
            group,
            resource,
            sub_resource: sub_resource.flatten(),
            operation: operation?,
            user_info: user_info.unwrap_or_default(),
            object: object.flatten(),
            old_object: old_object.flatten(),
        })
    }

    /// `request.resource`, as kube-core's `GroupVersionResource` reads it: its group and
    /// resource (a version is required too). Any other member is left to [`parse`].
    fn resource(&mut self) -> Option<(String, String)> {
        let (mut group, mut version, mut resource) = (None, None, None);
        self.object(|r, key| match key {
            b"group" => once(&mut group, r.string()),
            b"version" => once(&mut version, r.text()),
            b"resource" => once(&mut resource, r.string()),
            _ => None,
        })?;
        version?;
        Some((group?, resource?))
    }

    /// `request.userInfo`, as k8s-openapi's `UserInfo` reads it (a repeated member: the last
    /// wins; others skipped).
    fn user_info(&mut self) -> Option<UserInfo> {
        let mut user = UserInfo::default();
        self.object(|r, key| {
            match key {
                b"username" => user.username = r.nullable(Self::string)?,
                b"uid" => user.uid = r.nullable(Self::string)?,
                b"groups" => user.groups = r.nullable(Self::strings)?,
                b"extra" => user.extra = r.nullable(Self::extra)?,
                _ => r.skip(3)?,
            }
            Some(())
        })?;
        Some(user)
    }

    /// `userInfo.extra`: a map of string lists (a repeated key: the last wins, as a BTreeMap
    /// reads it).
    fn extra(&mut self) -> Option<std::collections::BTreeMap<String, Vec<String>>> {
        let mut extra = std::collections::BTreeMap::new();
        self.object(|r, key| {
            let key = std::str::from_utf8(key).ok()?.to_owned();
            extra.insert(key, r.strings()?);
            Some(())
        })?;
        Some(extra)
    }

    /// A request's object: its text and scan, when [`parse`] would accept it (it reads as a
    /// Value at its depth in the review, is an object, and its `metadata` is absent, null or
    /// an object, as [`check_envelope`] requires).
    fn kube_object(&mut self) -> Option<(&'a str, Scanned<'a>)> {
        let start = skip_ws(self.text.as_bytes(), self.i);
        let (end, scanned) = scan_value(self.text, start, OBJECT_DEPTH)?;
        self.i = end;
        let object = scanned.kind == Kind::Object && matches!(scanned.metadata, None | Some(Kind::Null | Kind::Object));
        Some((self.text.get(start..end)?, scanned)).filter(|_| object)
    }
}

/// The operation named `name`, as kube-core reads it.
fn wire_operation(name: &str) -> Option<WireOperation> {
    Some(match name {
        "CREATE" => WireOperation::Create,
        "UPDATE" => WireOperation::Update,
        "DELETE" => WireOperation::Delete,
        "CONNECT" => WireOperation::Connect,
        _ => return None,
    })
}

/// What defaulting reads of a SmolVM ([`Shape`]), from its scan: the spec's text read into its
/// shape, and the two members of `metadata` it reads (a `metadata` that is not an object reads
/// as none, as on the Value).
pub(super) fn defaulting_shape(scan: &Scanned<'_>) -> Option<Shape> {
    let spec = match scan.spec {
        Some(text) => serde_json::from_str::<SpecText>(text).ok()?.0,
        None => None,
    };
    if scan.metadata != Some(Kind::Object) {
        return Some(Shape {
            spec,
            ..Shape::default()
        });
    }
    let finalizers = match scan.finalizers {
        Some(text) => Finalizers::of_value(Some(&serde_json::from_str::<Value>(text).ok()?)),
        None => Finalizers::Unset,
    };
    Some(Shape {
        spec,
        metadata: true,
        deleting: scan.deletion_timestamp.is_some_and(|t| t.trim() != "null"),
        finalizers,
    })
}
