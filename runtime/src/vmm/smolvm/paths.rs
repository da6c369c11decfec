//! Where smolvm's machine calls go: `/api/v1/machines/{name}` and below, each name and file
//! path segment percent-encoded so that it stays one segment.

pub(super) const MACHINES: &str = "/api/v1/machines";

pub(super) fn machine_path(name: &str) -> String {
    format!("{MACHINES}/{}", encode_segment(name))
}

/// `/api/v1/machines/{name}/files/{path}`: each segment of `path` percent-encoded.
pub(super) fn file_path(name: &str, path: &str) -> String {
    let segments: Vec<String> = path.split('/').filter(|s| !s.is_empty()).map(encode_segment).collect();
    format!("{}/files/{}", machine_path(name), segments.join("/"))
}

/// Percent-encodes everything but letters, digits, `-`, `_` and `~` (dots too), so a name can
/// never add a path segment, a dot segment or a query.
pub(super) fn encode_segment(segment: &str) -> String {
    let mut out = String::with_capacity(segment.len());
    for byte in segment.bytes() {
        if byte.is_ascii_alphanumeric() || matches!(byte, b'-' | b'_' | b'~') {
            out.push(char::from(byte));
        } else {
            out.push_str(&format!("%{byte:02X}"));
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_cannot_escape_their_path_segment() {
        assert_eq!(machine_path("vm-1_a"), "/api/v1/machines/vm-1_a");
        assert_eq!(machine_path("../x?y=1"), "/api/v1/machines/%2E%2E%2Fx%3Fy%3D1");
    }
}
