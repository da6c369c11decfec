//! Discovery documents of the access API, so that the API server's aggregator (and `kubectl
//! api-resources`) see what it serves. No authorization is asked: the API server already allowed
//! the discovery request, which every authenticated user may make.

use serde_json::{Value, json};

use super::{GROUP, GROUP_VERSION, VERSION};

fn version() -> Value {
    json!({ "groupVersion": GROUP_VERSION, "version": VERSION })
}

fn group() -> Value {
    json!({ "name": GROUP, "versions": [version()], "preferredVersion": version() })
}

/// `GET /apis`: the one group.
pub fn group_list() -> Value {
    json!({ "kind": "APIGroupList", "apiVersion": "v1", "groups": [group()] })
}

/// `GET /apis/subresources.vm.smolvm.dev`.
pub fn api_group() -> Value {
    let mut g = group();
    g["kind"] = json!("APIGroup");
    g["apiVersion"] = json!("v1");
    g
}

/// `GET /apis/subresources.vm.smolvm.dev/v1alpha1`: the three subresources of `smolvms`.
pub fn resource_list() -> Value {
    let resource = |name: &str, verbs: &[&str]| json!({ "name": name, "singularName": "", "namespaced": true, "kind": "SmolVM", "verbs": verbs });
    json!({
        "kind": "APIResourceList",
        "apiVersion": "v1",
        "groupVersion": GROUP_VERSION,
        "resources": [
            resource("smolvms/log", &["get"]),
            resource("smolvms/exec", &["create"]),
            resource("smolvms/files", &["get", "create"]),
        ],
    })
}

/// `GET /openapi/v2`: an empty document (the subresources carry no schema of their own); the
/// aggregator merges it without complaint.
pub fn openapi_v2() -> Value {
    json!({
        "swagger": "2.0",
        "info": { "title": "smolvm access API", "version": VERSION },
        "paths": {},
    })
}

/// `GET /openapi/v3`: no paths.
pub fn openapi_v3() -> Value {
    json!({ "paths": {} })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn documents_name_the_group_and_the_subresources() {
        assert_eq!(group_list()["groups"][0]["name"], GROUP);
        assert_eq!(api_group()["preferredVersion"]["groupVersion"], GROUP_VERSION);
        let list = resource_list();
        let names: Vec<&str> = list["resources"]
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|r| r["name"].as_str())
            .collect();
        assert_eq!(names, ["smolvms/log", "smolvms/exec", "smolvms/files"]);
    }
}
