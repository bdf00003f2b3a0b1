//! `GET /openapi.json` describes exactly the routes the app serves.

use std::collections::BTreeSet;

use reqwest::Method;
use reqwest::StatusCode;
use serde_json::Value;

use crate::support::app::spawn_app;
async fn document() -> Value {
    let app = spawn_app().await;
    let res = app
        .client
        .get(app.url("/openapi.json"))
        .send()
        .await
        .unwrap();
    assert_eq!(res.status(), StatusCode::OK);
    res.json().await.unwrap()
}

/// (METHOD, path) of every operation in the document.
fn operations(doc: &Value) -> BTreeSet<(String, String)> {
    doc["paths"]
        .as_object()
        .unwrap()
        .iter()
        .flat_map(|(path, item)| {
            item.as_object()
                .unwrap()
                .keys()
                .filter(|k| {
                    ["get", "post", "put", "delete", "patch", "head", "options"]
                        .contains(&k.as_str())
                })
                .map(|m| (m.to_uppercase(), path.clone()))
                .collect::<Vec<_>>()
        })
        .collect()
}

#[tokio::test]
async fn the_document_lists_exactly_the_routes_the_app_registers() {
    let doc = document().await;
    assert_eq!(doc["openapi"], "3.1.0");
    let registered: BTreeSet<(String, String)> = dedupd::routes::endpoints()
        .iter()
        .map(|e| (e.method.to_string(), e.path.to_string()))
        .collect();
    let documented = operations(&doc);
    let undocumented: Vec<_> = registered.difference(&documented).collect();
    let unserved: Vec<_> = documented.difference(&registered).collect();
    assert!(
        undocumented.is_empty() && unserved.is_empty(),
        "registered but not documented: {undocumented:?}; documented but not registered: {unserved:?}"
    );
}

#[tokio::test]
async fn every_documented_operation_is_routed_by_the_running_app() {
    let doc = document().await;
    let app = spawn_app().await;
    for (method, path) in operations(&doc) {
        let concrete = path
            .replace("{key}", "k1")
            .replace("{stream}", "s1")
            .replace("{source}", "nosuch")
            .replace("{event_id}", "e1");
        let res = app
            .request(Method::from_bytes(method.as_bytes()).unwrap(), &concrete)
            .send()
            .await
            .unwrap();
        let status = res.status();
        let body = res.text().await.unwrap();
        assert_ne!(
            status,
            StatusCode::METHOD_NOT_ALLOWED,
            "{method} {path}: {body}"
        );
        assert!(
            !body.contains("no resource at"),
            "{method} {path} is documented but the router has no such resource: {body}"
        );
    }
}

#[tokio::test]
async fn every_operation_documents_its_errors_as_problem_json_and_every_reference_resolves() {
    let doc = document().await;
    let text = doc.to_string();
    let schemas = doc["components"]["schemas"].as_object().unwrap();
    for r in text.split("\"$ref\":\"#/components/schemas/").skip(1) {
        let name = r.split('"').next().unwrap();
        assert!(schemas.contains_key(name), "dangling reference to {name}");
    }
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let responses = op["responses"].as_object().unwrap();
            assert!(!responses.is_empty(), "{method} {path}: no responses");
            for (status, r) in responses {
                if status.starts_with('4') || status.starts_with('5') {
                    assert!(
                        r["content"]["application/problem+json"]["schema"]["$ref"]
                            == "#/components/schemas/Problem",
                        "{method} {path} {status}: not a problem document"
                    );
                }
            }
        }
    }
    let problem = &schemas["Problem"]["properties"];
    for field in ["type", "title", "status", "detail", "code"] {
        assert!(problem.get(field).is_some(), "Problem lacks {field}");
    }
}

#[tokio::test]
async fn every_operation_id_is_unique_and_reads_as_a_client_method() {
    let doc = document().await;
    let mut seen = BTreeSet::new();
    for (path, item) in doc["paths"].as_object().unwrap() {
        for (method, op) in item.as_object().unwrap() {
            let id = op["operationId"]
                .as_str()
                .unwrap_or_else(|| panic!("{method} {path} has no operationId"));
            assert!(
                id.chars().next().is_some_and(|c| c.is_ascii_lowercase())
                    && id.chars().all(|c| c.is_ascii_alphanumeric()),
                "{method} {path}: {id:?} is not a lowerCamelCase name"
            );
            assert!(seen.insert(id.to_owned()), "operationId {id} is used twice");
        }
    }
}

/// The document passes `openapi-spec-validator` (the validator code
/// generators' users run). Needs a Python that has it: `.ci/run` makes a
/// virtualenv and names its interpreter in `DEDUPD_TEST_PYTHON`.
#[tokio::test]
#[ignore = "needs DEDUPD_TEST_PYTHON (a python with openapi-spec-validator); .ci/run runs it"]
async fn the_document_passes_openapi_spec_validator() {
    let python = std::env::var("DEDUPD_TEST_PYTHON")
        .expect("DEDUPD_TEST_PYTHON names a python that has openapi-spec-validator (see .ci/run)");
    let app = spawn_app().await;
    let text = app
        .client
        .get(app.url("/openapi.json"))
        .send()
        .await
        .unwrap()
        .text()
        .await
        .unwrap();
    let file = app.dir.path().join("openapi.json");
    std::fs::write(&file, text).unwrap();
    let out = tokio::task::spawn_blocking(move || {
        std::process::Command::new(python)
            .args(["-m", "openapi_spec_validator"])
            .arg(file)
            .output()
            .unwrap()
    })
    .await
    .unwrap();
    assert!(
        out.status.success(),
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A done's `result` (issue 53) is described where a client meets it: the
/// done's body, a read of the key, and the problem of a `409 done`; and the
/// 413 a result over the cap gets.
#[tokio::test]
async fn a_done_result_is_described_in_the_body_the_read_and_the_problem() {
    let doc = document().await;
    let schemas = &doc["components"]["schemas"];
    for schema in ["DoneBody", "StateAnswer", "Problem"] {
        let result = &schemas[schema]["properties"]["result"];
        assert!(
            result.is_object(),
            "{schema} has no result: {}",
            schemas[schema]
        );
        // Any JSON value: a number, a string, an array are results too.
        assert!(
            result.get("type").is_none() && result.get("$ref").is_none(),
            "{schema}'s result is constrained: {result}"
        );
    }
    assert!(
        schemas["DoneBody"]["properties"]["result"]["description"]
            .as_str()
            .is_some_and(|d| d.contains("claims.max_result_bytes")),
        "{}",
        schemas["DoneBody"]
    );
    let done = &doc["paths"]["/v1/claims/{key}/done"]["post"];
    assert_eq!(
        done["requestBody"]["content"]["application/json"]["schema"]["$ref"],
        "#/components/schemas/DoneBody"
    );
    assert!(
        done["responses"]["413"].is_object(),
        "{}",
        done["responses"]
    );
    let extend = &doc["paths"]["/v1/claims/{key}/extend"]["post"];
    assert_eq!(
        extend["requestBody"]["content"]["application/json"]["schema"]["$ref"],
        "#/components/schemas/TokenTtlBody",
        "extend takes no result"
    );
}
