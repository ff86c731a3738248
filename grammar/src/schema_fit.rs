//! Fitting a client's JSON Schema to what the grammar engine compiles, so that a valid schema
//! is never refused (issue 48): each keyword llguidance cannot enforce is dropped from the
//! subschema that holds it, which keeps its `type` and every other constraint, and each such
//! loosening is reported as a [`Loosened`] naming where and what. Only a schema that is not
//! valid JSON Schema (checked against its draft's meta-schema) is an error.
//!
//! What llguidance 1.9 refuses, found by compiling a schema with each keyword (see
//! `tests/loosened_schemas.rs`, which fails when that changes):
//! - keywords it knows for the schema's draft but does not implement: `not`, `uniqueItems`,
//!   `dependencies`, `contains` (with `minContains`/`maxContains`), `propertyNames`,
//!   `if`/`then`/`else`, `dependentRequired`, `dependentSchemas`, `unevaluatedProperties`,
//!   `unevaluatedItems`, `$recursiveRef`/`$recursiveAnchor`, `$dynamicRef`/`$dynamicAnchor`;
//! - a `format` it has no pattern for; a `pattern` (or `patternProperties` name) using
//!   look-around or back-references; `patternProperties` whose patterns overlap;
//! - `minProperties`/`maxProperties` beside optional properties (except "at most/least one"
//!   of a closed object); `oneOf` whose branches it cannot prove disjoint;
//! - a `$ref` to a remote document (nothing is fetched), and a `$schema` it does not know.
//!
//! Some of these are rewritten exactly rather than dropped: `unevaluatedProperties` and
//! `unevaluatedItems` without in-place applicators beside them mean `additionalProperties`
//! and `items`; `uniqueItems: false`, empty dependency maps and anchors constrain nothing.

use std::fmt;

use llguidance::derivre::{RegexAst, RegexBuilder};
use serde_json::{Map, Value};

use crate::schema_shape::nesting_depth;
use crate::schema_walk::positions;
use crate::{Error, Limits, Result};

/// The formats llguidance has a pattern for (`json/formats.rs`).
const FORMATS: [&str; 11] = [
    "date-time",
    "time",
    "date",
    "duration",
    "email",
    "hostname",
    "ipv4",
    "ipv6",
    "uuid",
    "uri",
    "unknown",
];

/// The work llguidance spends proving two patterns disjoint, as it does itself.
const DISJOINT_CHECK_FUEL: u64 = 10_000;

/// The longest piece of client text (a format name, a URI) quoted in a note or message.
const MAX_QUOTED_CHARS: usize = 60;

/// One place where a schema was loosened to compile.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Loosened {
    /// The subschema's JSON pointer in the schema as given (`""` for the root).
    pub pointer: String,
    /// What it gave up, such as `propertyNames` or `oneOf (read as anyOf)`.
    pub what: String,
}

impl fmt::Display for Loosened {
    /// `#/properties/x: propertyNames` (a URI fragment, so the root reads `#`).
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "#{}: {}", self.pointer, self.what)
    }
}

/// JSON Schema drafts, in order, as llguidance tells them apart.
#[derive(Debug, Clone, Copy, PartialEq, Eq, PartialOrd, Ord)]
enum Draft {
    Draft4,
    Draft6,
    Draft7,
    Draft201909,
    Draft202012,
}

/// Rewrites `schema` into one the compiler accepts, loosening only what it cannot enforce,
/// and says where it loosened. A schema deeper than the compiler's cap is left as it is for
/// the compiler to refuse, naming the cap.
///
/// Fails with [`Error::Invalid`] when `schema` is not valid JSON Schema for its draft, or a
/// local `$ref` points at nothing; the message names the place and stays short.
pub fn fit_schema(schema: &mut Value) -> Result<Vec<Loosened>> {
    let mut notes = Vec::new();
    if nesting_depth(schema) > Limits::default().max_schema_depth {
        return Ok(notes);
    }
    let draft = dialect(schema, &mut notes);
    check_valid(schema)?;
    check_local_refs(schema)?;
    let unimplemented = unimplemented(draft);
    let mut renames = Vec::new();
    for position in positions(schema) {
        let Some(Value::Object(map)) = schema.pointer_mut(&position.pointer) else {
            // Under a keyword a parent dropped.
            continue;
        };
        let mut what = Vec::new();
        fit_keywords(map, &unimplemented, &mut what);
        fit_format(map, &mut what);
        fit_pattern(map, &mut what);
        fit_pattern_properties(map, &mut what);
        fit_property_counts(map, &mut what);
        fit_remote_ref(map, &mut what);
        if needs_any_of(map) {
            what.push("oneOf (read as anyOf)".to_string());
            renames.push(position.pointer.clone());
        }
        if !what.is_empty() {
            notes.push(Loosened {
                pointer: position.pointer,
                what: what.join(", "),
            });
        }
    }
    // After the walk, deepest first, so that the pointers of branches stay valid until done.
    for pointer in renames.iter().rev() {
        if let Some(Value::Object(map)) = schema.pointer_mut(pointer) {
            one_of_as_any_of(map);
        }
    }
    drop_dangling_refs(schema, &mut notes);
    Ok(notes)
}

/// The draft `$schema` names (2020-12 when it names none). One llguidance does not know is
/// dropped, and the schema read as 2020-12.
fn dialect(schema: &mut Value, notes: &mut Vec<Loosened>) -> Draft {
    let Some(map) = schema.as_object_mut() else {
        return Draft::Draft202012;
    };
    let Some(Value::String(uri)) = map.get("$schema").cloned() else {
        // Absent, or not a string (which the meta-schema check refuses).
        return Draft::Draft202012;
    };
    let draft = match uri.trim_end_matches('#') {
        "https://json-schema.org/draft/2020-12/schema" => Some(Draft::Draft202012),
        "https://json-schema.org/draft/2019-09/schema" => Some(Draft::Draft201909),
        "http://json-schema.org/draft-07/schema" => Some(Draft::Draft7),
        "http://json-schema.org/draft-06/schema" => Some(Draft::Draft6),
        "http://json-schema.org/draft-04/schema" => Some(Draft::Draft4),
        _ => None,
    };
    draft.unwrap_or_else(|| {
        let what = format!("$schema `{}` (read as 2020-12)", quoted(&uri));
        map.remove("$schema");
        notes.push(Loosened {
            pointer: String::new(),
            what,
        });
        Draft::Draft202012
    })
}

/// The keywords llguidance knows in `draft` but refuses to compile (its `IMPLEMENTED` list
/// against the draft's keywords); unknown keywords it ignores, as JSON Schema says.
fn unimplemented(draft: Draft) -> Vec<&'static str> {
    let mut keywords = vec!["dependencies", "not", "uniqueItems"];
    if draft >= Draft::Draft6 {
        keywords.extend(["contains", "propertyNames"]);
    }
    if draft >= Draft::Draft7 {
        keywords.extend(["if", "then", "else"]);
    }
    if draft >= Draft::Draft201909 {
        keywords.extend([
            "$recursiveAnchor",
            "$recursiveRef",
            "dependentRequired",
            "dependentSchemas",
            "maxContains",
            "minContains",
            "unevaluatedItems",
            "unevaluatedProperties",
        ]);
    }
    if draft == Draft::Draft202012 {
        keywords.extend(["$dynamicAnchor", "$dynamicRef"]);
    }
    keywords
}

/// Checks `schema` against its draft's meta-schema.
fn check_valid(schema: &Value) -> Result<()> {
    jsonschema::meta::validate(schema).map_err(|error| {
        // Masked: the message names the rule broken, not the (possibly huge) value.
        let message = error.masked().to_string();
        invalid(format!(
            "at `#{}`: {}",
            error.instance_path(),
            shortened(&message, 200)
        ))
    })
}

/// Refuses a local `$ref` (`#/…`) that points at nothing. A schema with nested `$id`s is
/// left to the compiler: its references resolve against those.
fn check_local_refs(schema: &Value) -> Result<()> {
    let all = positions(schema);
    if all.iter().any(|p| {
        !p.pointer.is_empty()
            && schema
                .pointer(&p.pointer)
                .and_then(Value::as_object)
                .is_some_and(|m| m.contains_key("$id") || m.contains_key("id"))
    }) {
        return Ok(());
    }
    for position in all {
        if let Some(target) = local_ref(schema, &position.pointer)
            && resolve(schema, &target).is_none()
        {
            return Err(invalid(format!(
                "`$ref` at `#{}` points at `#{}`, which is not in the schema",
                position.pointer,
                quoted(&target)
            )));
        }
    }
    Ok(())
}

/// The JSON pointer a local `$ref` at `pointer` names (`#/a/b` → `/a/b`), percent-decoded.
fn local_ref(schema: &Value, pointer: &str) -> Option<String> {
    let target = schema.pointer(pointer)?.get("$ref")?.as_str()?;
    let fragment = target.strip_prefix('#')?;
    // `#name` is an anchor, resolved by the compiler.
    (fragment.is_empty() || fragment.starts_with('/')).then(|| percent_decode(fragment))
}

fn resolve<'a>(schema: &'a Value, pointer: &str) -> Option<&'a Value> {
    if pointer.is_empty() {
        Some(schema)
    } else {
        schema.pointer(pointer)
    }
}

/// Drops the keywords llguidance does not implement, rewriting exactly where that is possible.
fn fit_keywords(map: &mut Map<String, Value>, unimplemented: &[&str], what: &mut Vec<String>) {
    let in_place = crate::schema_walk::IN_PLACE
        .iter()
        .any(|k| map.contains_key(*k))
        || map.contains_key("contains");
    for &keyword in unimplemented {
        let Some(value) = map.remove(keyword) else {
            continue;
        };
        let constrains = match keyword {
            "uniqueItems" => value != Value::Bool(false),
            "$recursiveAnchor" | "$dynamicAnchor" => false,
            "dependencies" | "dependentRequired" | "dependentSchemas" => {
                value.as_object().is_none_or(|m| !m.is_empty())
            }
            "minContains" | "maxContains" => {
                map.contains_key("contains") || what.iter().any(|w| w == "contains")
            }
            "unevaluatedProperties" | "unevaluatedItems" if value == Value::Bool(true) => false,
            "unevaluatedProperties" if !in_place => {
                // Every property is evaluated by `properties`, `patternProperties` and
                // `additionalProperties` alone: the rest is what `additionalProperties` covers.
                map.entry("additionalProperties").or_insert(value);
                false
            }
            "unevaluatedItems" if !in_place => {
                match map.get("items") {
                    Some(Value::Array(_)) => {
                        map.entry("additionalItems").or_insert(value);
                    }
                    Some(_) => {}
                    None => {
                        map.insert("items".to_string(), value);
                    }
                }
                false
            }
            _ => true,
        };
        if constrains {
            what.push(keyword.to_string());
        }
    }
}

/// Drops a `format` llguidance has no pattern for; it only matters where the value can be a
/// string (elsewhere it is an annotation, such as OpenAPI's `int32`).
fn fit_format(map: &mut Map<String, Value>, what: &mut Vec<String>) {
    let Some(Value::String(format)) = map.get("format") else {
        return;
    };
    if FORMATS.contains(&format.as_str()) {
        return;
    }
    let note = format!("format `{}`", quoted(format));
    map.remove("format");
    if may_be(map, "string") {
        what.push(note);
    }
}

/// Drops a `pattern` llguidance's regex engine cannot take (look-around, back-references).
fn fit_pattern(map: &mut Map<String, Value>, what: &mut Vec<String>) {
    if let Some(Value::String(pattern)) = map.get("pattern")
        && !compiles(pattern)
    {
        map.remove("pattern");
        what.push("pattern".to_string());
    }
}

/// Drops `patternProperties` entries whose pattern does not compile, and all of them when
/// the rest overlap (llguidance needs each name to match one pattern at most). A name they
/// matched then falls to `additionalProperties`, so that is relaxed too unless it allows
/// anything already: loosening must never forbid what the schema allowed.
fn fit_pattern_properties(map: &mut Map<String, Value>, what: &mut Vec<String>) {
    let Some(Value::Object(patterns)) = map.get_mut("patternProperties") else {
        return;
    };
    let before = patterns.len();
    patterns.retain(|pattern, _| compiles(pattern));
    let mut dropped = patterns.len() < before;
    let names: Vec<&String> = patterns.keys().collect();
    let pairs = names.len() * names.len().saturating_sub(1) / 2;
    // Past the cap the compiler refuses the schema, naming it; no need to check here.
    if pairs <= Limits::default().max_pattern_pairs && !disjoint(&names) {
        patterns.clear();
        dropped = true;
    }
    if !dropped {
        return;
    }
    if patterns.is_empty() {
        map.remove("patternProperties");
    }
    what.push("patternProperties".to_string());
    if map
        .get("additionalProperties")
        .is_some_and(|a| *a != Value::Bool(true))
    {
        map.remove("additionalProperties");
        what.push("additionalProperties".to_string());
    }
}

/// Drops `minProperties`/`maxProperties` where llguidance cannot count optional properties:
/// it can only when every listed property is required, or for "at most/least one" more on an
/// object that allows no others.
fn fit_property_counts(map: &mut Map<String, Value>, what: &mut Vec<String>) {
    let min = map.get("minProperties").and_then(Value::as_u64);
    let max = map.get("maxProperties").and_then(Value::as_u64);
    if min.is_none() && max.is_none() {
        return;
    }
    let required: Vec<&str> = map
        .get("required")
        .and_then(Value::as_array)
        .map(|r| r.iter().filter_map(Value::as_str).collect())
        .unwrap_or_default();
    let mut distinct = required.clone();
    distinct.sort_unstable();
    distinct.dedup();
    let optional = map
        .get("properties")
        .and_then(Value::as_object)
        .map_or(0, |p| {
            p.keys().filter(|k| !distinct.contains(&k.as_str())).count()
        });
    let num_required = distinct.len() as u64;
    let min_more = min.unwrap_or(0).saturating_sub(num_required);
    let max_more = max.map(|m| m.saturating_sub(num_required));
    if optional == 0 || (min_more == 0 && max_more.is_none()) {
        return;
    }
    let closed = map.get("additionalProperties") == Some(&Value::Bool(false))
        && !map.contains_key("patternProperties");
    if closed && min_more <= 1 && max_more.unwrap_or(1) == 1 {
        return;
    }
    for keyword in ["minProperties", "maxProperties"] {
        if map.remove(keyword).is_some() {
            what.push(keyword.to_string());
        }
    }
}

/// Drops a `$ref` to another document: nothing is fetched.
fn fit_remote_ref(map: &mut Map<String, Value>, what: &mut Vec<String>) {
    if let Some(Value::String(target)) = map.get("$ref")
        && !target.starts_with('#')
    {
        let note = format!("$ref `{}` (remote schemas are not fetched)", quoted(target));
        map.remove("$ref");
        what.push(note);
    }
}

/// Whether a `oneOf` here needs reading as `anyOf`: llguidance takes `oneOf` only when it can
/// prove the branches disjoint. Branches of distinct single types are (integer and number
/// overlap); for others, "exactly one" is loosened to "at least one".
fn needs_any_of(map: &Map<String, Value>) -> bool {
    let Some(Value::Array(branches)) = map.get("oneOf") else {
        return false;
    };
    let mut types = Vec::new();
    for branch in branches {
        match branch.get("type").and_then(Value::as_str) {
            Some(t) if !types.contains(&t) => types.push(t),
            _ => return true,
        }
    }
    types.contains(&"integer") && types.contains(&"number")
}

/// Renames `oneOf` to `anyOf`, or, beside an `anyOf` already there, adds it to `allOf` as one.
fn one_of_as_any_of(map: &mut Map<String, Value>) {
    let Some(branches) = map.remove("oneOf") else {
        return;
    };
    if !map.contains_key("anyOf") {
        map.insert("anyOf".to_string(), branches);
        return;
    }
    let wrapped = Value::Object(Map::from_iter([("anyOf".to_string(), branches)]));
    match map.get_mut("allOf") {
        Some(Value::Array(all)) => all.push(wrapped),
        _ => {
            map.insert("allOf".to_string(), Value::Array(vec![wrapped]));
        }
    }
}

/// Drops `$ref`s left pointing into a keyword that was dropped.
fn drop_dangling_refs(schema: &mut Value, notes: &mut Vec<Loosened>) {
    let dangling: Vec<String> = positions(schema)
        .into_iter()
        .filter(|p| local_ref(schema, &p.pointer).is_some_and(|t| resolve(schema, &t).is_none()))
        .map(|p| p.pointer)
        .collect();
    for pointer in dangling {
        if let Some(Value::Object(map)) = schema.pointer_mut(&pointer) {
            map.remove("$ref");
            notes.push(Loosened {
                pointer,
                what: "$ref (into a dropped keyword)".to_string(),
            });
        }
    }
}

/// Whether llguidance's regex engine takes `pattern` (as it reads `pattern`: a search).
fn compiles(pattern: &str) -> bool {
    RegexBuilder::new()
        .mk_regex_for_serach(&llguidance::regex_to_lark(pattern, "dw"))
        .is_ok()
}

/// Whether no name matches two of `patterns`, as llguidance checks it (undecided is no).
fn disjoint(patterns: &[&String]) -> bool {
    let mut builder = RegexBuilder::new();
    let Ok(refs) = patterns
        .iter()
        .map(|p| builder.mk_regex_for_serach(&llguidance::regex_to_lark(p, "dw")))
        .collect::<std::result::Result<Vec<_>, _>>()
    else {
        return false;
    };
    for (i, a) in refs.iter().enumerate() {
        for b in &refs[i + 1..] {
            let both = builder.mk(&RegexAst::And(vec![
                RegexAst::ExprRef(*a),
                RegexAst::ExprRef(*b),
            ]));
            let empty = both
                .and_then(|r| builder.to_regex_limited(r, DISJOINT_CHECK_FUEL))
                .map(|mut rx| rx.always_empty());
            if !matches!(empty, Ok(true)) {
                return false;
            }
        }
    }
    true
}

/// Whether a value of JSON type `name` can satisfy this subschema's `type` (absent: any).
fn may_be(map: &Map<String, Value>, name: &str) -> bool {
    match map.get("type") {
        Some(Value::String(t)) => t == name,
        Some(Value::Array(ts)) => ts.iter().any(|t| t == name),
        _ => true,
    }
}

fn invalid(message: String) -> Error {
    Error::Invalid {
        kind: "JSON schema",
        message,
    }
}

/// Client text as quoted in notes: at most [`MAX_QUOTED_CHARS`], backticks replaced.
fn quoted(text: &str) -> String {
    shortened(&text.replace('`', "'"), MAX_QUOTED_CHARS)
}

fn shortened(text: &str, chars: usize) -> String {
    match text.char_indices().nth(chars) {
        Some((cut, _)) => format!("{}…", &text[..cut]),
        None => text.to_string(),
    }
}

/// `%XX` escapes decoded, as in a URI fragment; a malformed escape stays as written.
fn percent_decode(text: &str) -> String {
    let bytes = text.as_bytes();
    let mut out = Vec::with_capacity(bytes.len());
    let mut i = 0;
    while i < bytes.len() {
        let hex = bytes
            .get(i + 1..i + 3)
            .and_then(|h| std::str::from_utf8(h).ok())
            .and_then(|h| u8::from_str_radix(h, 16).ok());
        match (bytes[i], hex) {
            (b'%', Some(byte)) => {
                out.push(byte);
                i += 3;
            }
            (byte, _) => {
                out.push(byte);
                i += 1;
            }
        }
    }
    String::from_utf8_lossy(&out).into_owned()
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn fitted(mut schema: Value) -> (Value, Vec<String>) {
        let notes = fit_schema(&mut schema).unwrap();
        (schema, notes.iter().map(ToString::to_string).collect())
    }

    #[test]
    fn property_names_is_dropped_and_the_rest_kept() {
        let (schema, notes) = fitted(json!({"type": "object", "properties": {"env": {
            "type": "object", "propertyNames": {"pattern": "^[A-Z_]+$"},
            "additionalProperties": {"type": "string"}}}}));
        assert_eq!(
            schema,
            json!({"type": "object", "properties": {"env": {
                "type": "object", "additionalProperties": {"type": "string"}}}})
        );
        assert_eq!(notes, ["#/properties/env: propertyNames"]);
    }

    #[test]
    fn each_unimplemented_keyword_is_dropped_with_a_note() {
        let cases = [
            (json!({"type": "string", "not": {"const": "x"}}), "not"),
            (json!({"type": "array", "uniqueItems": true}), "uniqueItems"),
            (
                json!({"type": "array", "contains": {"type": "integer"}, "minContains": 2}),
                "contains, minContains",
            ),
            (
                json!({"type": "object", "if": {"required": ["a"]}, "then": {"required": ["b"]},
                    "else": {}}),
                "if, then, else",
            ),
            (
                json!({"type": "object", "dependentRequired": {"a": ["b"]}}),
                "dependentRequired",
            ),
            (
                json!({"type": "object", "dependentSchemas": {"a": {"required": ["b"]}}}),
                "dependentSchemas",
            ),
            (
                json!({"type": "object", "dependencies": {"a": ["b"]}}),
                "dependencies",
            ),
            (
                json!({"type": "object", "allOf": [{}], "unevaluatedProperties": false}),
                "unevaluatedProperties",
            ),
            (
                json!({"type": "array", "allOf": [{}], "unevaluatedItems": false}),
                "unevaluatedItems",
            ),
            (
                json!({"$defs": {"x": {"type": "string"}}, "$dynamicRef": "#meta"}),
                "$dynamicRef",
            ),
            (
                json!({"$schema": "https://json-schema.org/draft/2019-09/schema",
                    "$recursiveRef": "#"}),
                "$recursiveRef",
            ),
        ];
        for (schema, expected) in cases {
            let (after, notes) = fitted(schema.clone());
            assert_eq!(notes, [format!("#: {expected}")], "{schema}");
            for keyword in expected.split(", ") {
                assert!(after.get(keyword).is_none(), "{after}");
            }
            assert_eq!(after.get("type"), schema.get("type"));
        }
    }

    #[test]
    fn exact_rewrites_and_no_ops_leave_no_note() {
        let cases = [
            (
                json!({"type": "array", "uniqueItems": false}),
                json!({"type": "array"}),
            ),
            (
                json!({"type": "object", "unevaluatedProperties": false}),
                json!({"type": "object", "additionalProperties": false}),
            ),
            (
                json!({"type": "object", "additionalProperties": true, "unevaluatedProperties": false}),
                json!({"type": "object", "additionalProperties": true}),
            ),
            (
                json!({"type": "array", "prefixItems": [{}], "unevaluatedItems": false}),
                json!({"type": "array", "prefixItems": [{}], "items": false}),
            ),
            (
                json!({"type": "object", "dependentRequired": {}}),
                json!({"type": "object"}),
            ),
            (
                json!({"$dynamicAnchor": "meta", "type": "string"}),
                json!({"type": "string"}),
            ),
            (
                json!({"type": "integer", "format": "int32"}),
                json!({"type": "integer"}),
            ),
            (
                json!({"type": "string", "format": "date-time"}),
                json!({"type": "string", "format": "date-time"}),
            ),
        ];
        for (schema, expected) in cases {
            let (after, notes) = fitted(schema.clone());
            assert_eq!(after, expected, "{schema}");
            assert!(notes.is_empty(), "{schema}: {notes:?}");
        }
    }

    #[test]
    fn a_draft_decides_which_keywords_are_keywords() {
        // In draft 4 `propertyNames` is an unknown keyword, which the compiler ignores.
        let draft4 = json!({"$schema": "http://json-schema.org/draft-04/schema#",
                            "type": "object", "propertyNames": {"maxLength": 3}});
        assert_eq!(fitted(draft4.clone()), (draft4, vec![]));
        let draft7 = json!({"$schema": "http://json-schema.org/draft-07/schema#",
                            "type": "object", "propertyNames": {"maxLength": 3}});
        assert_eq!(fitted(draft7).1, ["#: propertyNames"]);
        let (after, notes) =
            fitted(json!({"$schema": "https://example.com/mine", "type": "string"}));
        assert_eq!(after, json!({"type": "string"}));
        assert_eq!(
            notes,
            ["#: $schema `https://example.com/mine` (read as 2020-12)"]
        );
    }

    #[test]
    fn formats_patterns_and_pattern_properties_the_engine_lacks_are_dropped() {
        let (after, notes) = fitted(json!({"type": "object", "properties": {
            "c": {"type": "string", "format": "color", "maxLength": 7},
            "p": {"type": "string", "pattern": "^(?=a)a+$", "minLength": 1},
            "b": {"type": "string", "pattern": "(a)\\1"},
            "ok": {"type": "string", "pattern": "^[a-z]+$"}
        }}));
        assert_eq!(
            after["properties"],
            json!({"c": {"type": "string", "maxLength": 7}, "p": {"type": "string", "minLength": 1},
                   "b": {"type": "string"}, "ok": {"type": "string", "pattern": "^[a-z]+$"}})
        );
        assert_eq!(
            notes,
            [
                "#/properties/c: format `color`",
                "#/properties/p: pattern",
                "#/properties/b: pattern"
            ]
        );
        let (after, notes) = fitted(json!({"type": "object", "additionalProperties": false,
            "patternProperties": {"^a": {"type": "string"}, "^ab": {"type": "integer"}}}));
        assert_eq!(after, json!({"type": "object"}));
        assert_eq!(notes, ["#: patternProperties, additionalProperties"]);
        let disjoint = json!({"type": "object",
            "patternProperties": {"^a": {"type": "string"}, "^b": {"type": "integer"}}});
        assert_eq!(fitted(disjoint.clone()), (disjoint, vec![]));
        let (after, _) = fitted(json!({"type": "object",
            "patternProperties": {"^(?=x)": {}, "^y": {"type": "integer"}}}));
        assert_eq!(
            after,
            json!({"type": "object", "patternProperties": {"^y": {"type": "integer"}}})
        );
    }

    #[test]
    fn property_counts_are_kept_where_the_engine_can_count() {
        let optional =
            json!({"type": "object", "properties": {"a": {}, "b": {}}, "minProperties": 1});
        let (after, notes) = fitted(optional);
        assert!(after.get("minProperties").is_none());
        assert_eq!(notes, ["#: minProperties"]);
        for kept in [
            json!({"type": "object", "properties": {"a": {}, "b": {}}, "required": ["a", "b"],
                   "minProperties": 2}),
            json!({"type": "object", "properties": {"a": {}, "b": {}}, "minProperties": 1,
                   "maxProperties": 1, "additionalProperties": false}),
            json!({"type": "object", "minProperties": 1}),
        ] {
            assert_eq!(fitted(kept.clone()), (kept, vec![]));
        }
    }

    #[test]
    fn one_of_is_read_as_any_of_unless_its_branches_are_of_distinct_types() {
        let typed = json!({"oneOf": [{"type": "string"}, {"type": "integer"}]});
        assert_eq!(fitted(typed.clone()), (typed, vec![]));
        let (after, notes) = fitted(json!({"oneOf": [
            {"type": "object", "properties": {"a": {"oneOf": [{"type": "integer"}, {"type": "number"}]}}},
            {"type": "object"}]}));
        assert_eq!(
            after,
            json!({"anyOf": [
                {"type": "object", "properties": {"a": {"anyOf": [{"type": "integer"}, {"type": "number"}]}}},
                {"type": "object"}]})
        );
        assert_eq!(
            notes,
            [
                "#: oneOf (read as anyOf)",
                "#/oneOf/0/properties/a: oneOf (read as anyOf)"
            ]
        );
        let (after, _) = fitted(json!({"anyOf": [{}], "oneOf": [{}, {}]}));
        assert_eq!(
            after,
            json!({"anyOf": [{}], "allOf": [{"anyOf": [{}, {}]}]})
        );
    }

    #[test]
    fn references_outside_the_schema_are_dropped_and_dangling_ones_refused() {
        let (after, notes) = fitted(json!({"type": "object", "properties": {
            "r": {"$ref": "https://example.com/s.json", "description": "remote"}}}));
        assert_eq!(after["properties"]["r"], json!({"description": "remote"}));
        assert_eq!(
            notes,
            ["#/properties/r: $ref `https://example.com/s.json` (remote schemas are not fetched)"]
        );
        let mut dangling = json!({"properties": {"a": {"$ref": "#/$defs/missing"}}});
        let message = fit_schema(&mut dangling).unwrap_err().to_string();
        assert!(
            message.contains("`#/properties/a` points at `#/$defs/missing`"),
            "{message}"
        );
        let (_, notes) = fitted(json!({"properties": {"a": {"not": {"type": "null"}},
                                                      "b": {"$ref": "#/properties/a/not"}}}));
        assert_eq!(
            notes,
            [
                "#/properties/a: not",
                "#/properties/b: $ref (into a dropped keyword)"
            ]
        );
        let (_, notes) =
            fitted(json!({"$defs": {"a b": {"type": "string"}}, "$ref": "#/$defs/a%20b"}));
        assert!(notes.is_empty());
    }

    #[test]
    fn invalid_schemas_are_short_errors_naming_the_place() {
        let huge = "x".repeat(50_000);
        for schema in [
            json!({"type": "object", "properties": {"n": {"type": "wat"}}}),
            json!({"type": "object", "properties": []}),
            json!({"type": "string", "minLength": "a"}),
            json!({"type": "object", "required": huge}),
            json!({"type": "object", "properties": {"x": {"enum": huge}}}),
        ] {
            let message = fit_schema(&mut schema.clone()).unwrap_err().to_string();
            assert!(message.len() < 400, "{} chars: {message}", message.len());
            assert!(
                message.starts_with("invalid JSON schema: at `#"),
                "{message}"
            );
            assert!(!message.contains("xxxxxxxxxx"), "{message}");
        }
    }

    #[test]
    fn data_that_looks_like_keywords_is_left_alone() {
        let schema = json!({"type": "object", "properties": {"not": {"type": "string",
            "default": {"not": 1}, "examples": [{"propertyNames": {}}]}}});
        assert_eq!(fitted(schema.clone()), (schema, vec![]));
    }
}
