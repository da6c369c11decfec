//! The fast reading of a review: a hand-written scanner that checks a request's objects in place
//! (depth, shape, `metadata`) and picks out what defaulting reads, so the happy path builds no
//! `serde_json::Value` tree for them. It exists for speed (the `handler` bench measures it); for
//! every body it accepts it must answer as [`parse`](super::wire::parse) does, which the tests
//! check against the reference reading.

use serde_json::{Value, value::RawValue};
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

/// The four hex digits at `b[at..]`.
fn hex4(b: &[u8], at: usize) -> Option<u16> {
    let digits = std::str::from_utf8(b.get(at..at + 4)?).ok()?;
    u16::from_str_radix(digits, 16).ok()
}

/// The end (index of the closing quote) of the string whose content starts at `b[start..]`,
/// and whether it has escapes; `None` when `\u` escapes are not paired the way a
/// `serde_json::Value` read requires (a trailing surrogate alone, or a leading one not followed
/// by `\u` and a trailing one).
fn scan_string(b: &[u8], start: usize) -> Option<(usize, bool)> {
    let mut i = start;
    let mut escaped = false;
    loop {
        i += memchr::memchr2(b'"', b'\\', b.get(i..)?)?;
        if b[i] == b'"' {
            return Some((i, escaped));
        }
        escaped = true;
        if b.get(i + 1) != Some(&b'u') {
            i += 2;
            continue;
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

/// What [`scan_object`] learns about an object.
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

/// Checks a request's object, given as text that is well-formed JSON (serde_json read it as a
/// `RawValue`, which checks the syntax), for what a `serde_json::Value` read checks beyond the
/// syntax: the nesting limit (at the object's depth in a review), `\u` surrogate pairs, and
/// numbers that do not fit an f64. On the way it notes where the members the rules read are
/// (later repeats of a key win, as in a Value). `None` when a Value read would fail, or when a
/// key of the object or of its `metadata` has escapes (not worth decoding here; the Value path
/// handles it).
pub(super) fn scan_object(text: &str) -> Option<Scanned<'_>> {
    let b = text.as_bytes();
    let mut scan = Scan::new(text, kind_at(*b.first()?));
    if scan.out.kind != Kind::Object {
        return Some(scan.out);
    }
    let mut i = 0;
    while let Some(&c) = b.get(i) {
        // (An if-chain in order of frequency: a `match` here compiles to a jump table whose
        // indirect branch mispredicts on almost every byte.)
        i = if c == b'"' {
            scan.string(i)?
        } else if c == b':' {
            i + 1
        } else if c == b',' {
            scan.expect_key = scan.keys_here();
            i + 1
        } else if c == b'{' || c == b'[' {
            scan.value(c, i, i + 1, true)?
        } else if c == b'}' || c == b']' {
            scan.depth = scan.depth.checked_sub(1)?;
            scan.close(scan.depth, i + 1);
            i + 1
        } else if c.is_ascii_digit() || c == b'-' {
            scan.value(c, i, number_end(text, i)?, false)?
        } else if c == b't' || c == b'n' {
            scan.value(c, i, i + 4, false)?
        } else if c == b'f' {
            scan.value(c, i, i + 5, false)?
        } else {
            i + 1 // whitespace
        };
    }
    Some(scan.out)
}

/// The end of the number starting at `text[i..]`; `None` when it is one a Value read refuses
/// (out of an f64's range).
fn number_end(text: &str, i: usize) -> Option<usize> {
    let b = text.as_bytes();
    let len = b[i..]
        .iter()
        .position(|c| !matches!(c, b'0'..=b'9' | b'-' | b'+' | b'.' | b'e' | b'E'))
        .unwrap_or(b.len() - i);
    let number = &text[i..i + len];
    // A plain integer of up to 19 digits is a u64 or an i64; anything else may be an f64 out of
    // range, which only serde_json itself can tell.
    let plain = len < 20 && !number.contains(['.', 'e', 'E']);
    if !plain && serde_json::from_str::<Value>(number).is_err() {
        return None;
    }
    Some(i + len)
}

/// The state of [`scan_object`] between two tokens.
struct Scan<'a> {
    text: &'a str,
    out: Scanned<'a>,
    /// Containers open around the current position.
    depth: u32,
    /// Inside the current `metadata` object.
    in_metadata: bool,
    /// Inside an `annotations` object of the current `metadata`, and whether it may be cut.
    in_annotations: bool,
    annotations_cuttable: bool,
    /// The next string is a key of the object or of its metadata.
    expect_key: bool,
    /// A key was just read: the next value is its member's.
    expect_value: bool,
    /// The member at depth 1 and where its value starts.
    key1: Member,
    start1: Option<usize>,
    /// The member of metadata (depth 2) and where its value starts.
    key2: Member,
    start2: Option<usize>,
}

impl<'a> Scan<'a> {
    fn new(text: &'a str, kind: Kind) -> Self {
        Scan {
            text,
            out: Scanned {
                kind,
                metadata: None,
                spec: None,
                deletion_timestamp: None,
                finalizers: None,
                cuts: [(0, 0, Cut::Null); MAX_CUTS],
                n_cuts: 0,
            },
            depth: 0,
            in_metadata: false,
            in_annotations: false,
            annotations_cuttable: false,
            expect_key: false,
            expect_value: false,
            key1: Member::Other,
            start1: None,
            key2: Member::Other,
            start2: None,
        }
    }

    /// Whether the keys of the container open here are read: the object's, its metadata's and
    /// its metadata's annotations'.
    fn keys_here(&self) -> bool {
        self.depth == 1 || (self.depth == 2 && self.in_metadata) || (self.depth == 3 && self.in_annotations)
    }

    /// The string starting at `i`, a key or a value; where the scan goes on.
    fn string(&mut self, i: usize) -> Option<usize> {
        let b = self.text.as_bytes();
        let (end, escaped) = scan_string(b, i + 1)?;
        if !self.expect_key {
            return self.value(b'"', i, end + 1, false);
        }
        let key = &b[i + 1..end];
        if self.depth == 3 {
            // An annotation's key: one the rules may read (or that may decode to one) keeps the
            // annotations in.
            if escaped || key.starts_with(RULE_ANNOTATION_PREFIX) {
                self.annotations_cuttable = false;
            }
            self.expect_key = false;
            self.expect_value = true;
            return Some(end + 1);
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
        self.expect_key = false;
        self.expect_value = true;
        Some(end + 1)
    }

    /// A value starting at `i` with byte `c`: a scalar ending at `next`, or a container that
    /// `opens` there. Where the scan goes on; `None` past the nesting limit.
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
            if OBJECT_DEPTH + self.depth >= JSON_DEPTH_LIMIT {
                return None;
            }
            self.expect_key = c == b'{' && self.keys_here();
        } else {
            self.close(self.depth, next);
        }
        Some(next)
    }

    /// A value at `depth` ended at `end`: note it if it is a member the scan keeps.
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

    /// Leaves `text[start..end]` out of [`Scanned::slimmed`], `with` in its place (not past
    /// [`MAX_CUTS`], nor past 4 GiB of text).
    fn cut(&mut self, start: usize, end: usize, with: Cut) {
        let (Ok(start), Ok(end)) = (u32::try_from(start), u32::try_from(end)) else {
            return;
        };
        if let Some(slot) = self.out.cuts.get_mut(self.out.n_cuts) {
            *slot = (start, end, with);
            self.out.n_cuts += 1;
        }
    }
}

/// The scan of `raw` (a request's object) when it is one [`parse`] accepts as a Value and that
/// passes [`check_envelope`]: it reads as a Value at its depth in the review, is an object, and
/// its `metadata` is absent, null or an object.
fn scan_text_object(raw: &RawValue) -> Option<Scanned<'_>> {
    scan_object(raw.get())
        .filter(|s| s.kind == Kind::Object && matches!(s.metadata, None | Some(Kind::Null | Kind::Object)))
}

/// A request with its objects as text, and the scans of its new and old objects.
pub(super) type TextObjects<'a> = (TextRequest<'a>, Option<Scanned<'a>>, Option<Scanned<'a>>);

/// The request of `body` with its objects as text, when [`parse`] would accept `body` and the
/// objects are well-formed; `None` for anything else (then [`parse`] decides).
pub(super) fn parse_text(body: &[u8]) -> Option<TextObjects<'_>> {
    let review = serde_json::from_slice::<TextReview<'_>>(body).ok()?;
    if review.kind != ADMISSION_KIND || review.api_version != ADMISSION_API_VERSION {
        return None;
    }
    let request = review.request?;
    let new = match request.object {
        Some(raw) => Some(scan_text_object(raw)?),
        None => None,
    };
    let old = match request.old_object {
        Some(raw) => Some(scan_text_object(raw)?),
        None => None,
    };
    Some((request, new, old))
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
