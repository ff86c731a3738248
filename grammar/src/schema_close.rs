//! Closing the objects of a tool's parameters: an object that lists its `properties` and says
//! nothing of others takes only those. JSON Schema allows any extra property there, and a
//! small model asked for a call pads the arguments with invented keys until it runs out of
//! tokens (issue 48: 2 of 10 forced calls never finished). A tool cannot use keys it never
//! declared, so for tool arguments the closed reading is the useful one.
//!
//! An object is left open wherever closing could forbid what the schema allows: where it says
//! how to treat other properties (`additionalProperties`, `patternProperties`,
//! `propertyNames`, `unevaluatedProperties`), where other schemas apply to the same value
//! beside it (`allOf`, `$ref`, `if`, dependencies) or it is one of those (an `allOf` member,
//! the target of a `$ref` with siblings, a branch of a choice its parent also constrains, and
//! everything beneath them), and where it requires a property it does not list.

use std::collections::HashSet;

use serde_json::{Map, Value};

use crate::schema_walk::{Position, positions};

/// Keywords beside which other schemas judge the same value's properties, so closing could
/// contradict them (besides the in-place applicators, [`crate::schema_walk::IN_PLACE`]).
const BESIDE: [&str; 4] = [
    "additionalProperties",
    "unevaluatedProperties",
    "patternProperties",
    "propertyNames",
];

/// Keywords that say something about an object's properties: a choice beneath a schema with
/// any of them is combined with it, so its branches stay open.
const OBJECT_KEYWORDS: [&str; 11] = [
    "properties",
    "patternProperties",
    "additionalProperties",
    "unevaluatedProperties",
    "required",
    "propertyNames",
    "minProperties",
    "maxProperties",
    "dependentRequired",
    "dependentSchemas",
    "dependencies",
];

/// Keywords whose subschemas describe something other than the value at that place (its
/// property names, some of its items) or only test it: never closed.
const NOT_THE_VALUE: [&str; 10] = [
    "not",
    "if",
    "then",
    "else",
    "contains",
    "propertyNames",
    "dependentSchemas",
    "dependencies",
    "unevaluatedProperties",
    "contentSchema",
];

/// Adds `additionalProperties: false` to each object in `schema` that lists its properties
/// and can be closed without forbidding anything the schema otherwise allows (see the module
/// docs).
pub fn close_objects(schema: &mut Value) {
    let all = positions(schema);
    let open = left_open(schema, &all);
    for position in &all {
        if open.contains(position.pointer.as_str()) {
            continue;
        }
        if let Some(Value::Object(map)) = schema.pointer_mut(&position.pointer)
            && closable(map)
        {
            map.insert("additionalProperties".to_string(), Value::Bool(false));
        }
    }
}

/// Pointers of positions combined with other schemas: `allOf` members, choices under an
/// object-constraining parent, tests, `$ref` targets reached from any of those or from a
/// `$ref` with sibling constraints, and everything beneath them.
fn left_open<'a>(schema: &Value, all: &'a [Position]) -> HashSet<&'a str> {
    let mut open: HashSet<&str> = HashSet::new();
    let mut targets: HashSet<String> = HashSet::new();
    loop {
        let before = (open.len(), targets.len());
        for position in all {
            let inherited = open.contains(position.parent.as_str()) && !position.pointer.is_empty();
            let combined = match position.keyword {
                "allOf" => true,
                "anyOf" | "oneOf" => schema
                    .pointer(&position.parent)
                    .and_then(Value::as_object)
                    .is_some_and(|parent| OBJECT_KEYWORDS.iter().any(|k| parent.contains_key(*k))),
                keyword => NOT_THE_VALUE.contains(&keyword),
            };
            let targeted = targets
                .iter()
                .any(|t| position.pointer == *t || position.pointer.starts_with(&format!("{t}/")));
            if inherited || combined || targeted {
                open.insert(&position.pointer);
            }
            let Some(map) = schema.pointer(&position.pointer).and_then(Value::as_object) else {
                continue;
            };
            if let Some(Value::String(target)) = map.get("$ref")
                && let Some(pointer) = target.strip_prefix('#')
                && (open.contains(position.pointer.as_str()) || has_siblings(map))
            {
                targets.insert(pointer.to_string());
            }
        }
        if (open.len(), targets.len()) == before {
            return open;
        }
    }
}

/// Whether a schema holding a `$ref` also constrains the value itself (annotations aside).
fn has_siblings(map: &Map<String, Value>) -> bool {
    const ANNOTATIONS: [&str; 8] = [
        "$ref",
        "title",
        "description",
        "default",
        "examples",
        "$comment",
        "deprecated",
        "readOnly",
    ];
    map.keys().any(|k| !ANNOTATIONS.contains(&k.as_str()))
}

/// Whether this object lists its properties and nothing beside it says more about others.
fn closable(map: &Map<String, Value>) -> bool {
    let Some(Value::Object(properties)) = map.get("properties") else {
        return false;
    };
    let object_type = match map.get("type") {
        None => true,
        Some(Value::String(t)) => t == "object",
        Some(Value::Array(ts)) => ts.iter().any(|t| t == "object"),
        Some(_) => false,
    };
    if !object_type
        || BESIDE
            .iter()
            .chain(&crate::schema_walk::IN_PLACE)
            .any(|k| map.contains_key(*k))
    {
        return false;
    }
    let lists_required = map
        .get("required")
        .and_then(Value::as_array)
        .is_none_or(|r| {
            r.iter()
                .all(|n| n.as_str().is_some_and(|n| properties.contains_key(n)))
        });
    let room = map
        .get("minProperties")
        .and_then(Value::as_u64)
        .is_none_or(|min| min <= properties.len() as u64);
    lists_required && room && !map.contains_key("dependentRequired")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    fn closed(mut schema: Value) -> Value {
        close_objects(&mut schema);
        schema
    }

    #[test]
    fn listed_properties_close_their_object_at_every_level() {
        let schema = json!({"type": "object", "properties": {
            "a": {"type": "object", "properties": {"b": {"type": "string"}}},
            "list": {"type": "array", "items": {"type": "object", "properties": {"c": {}}}},
            "map": {"type": "object"},
            "either": {"anyOf": [{"type": "object", "properties": {"d": {}}}, {"type": "null"}]}
        }, "required": ["a"]});
        let after = closed(schema);
        assert_eq!(after["additionalProperties"], false);
        assert_eq!(after["properties"]["a"]["additionalProperties"], false);
        assert_eq!(
            after["properties"]["list"]["items"]["additionalProperties"],
            false
        );
        assert_eq!(
            after["properties"]["either"]["anyOf"][0]["additionalProperties"],
            false
        );
        // A free-form map lists no properties: it stays a map.
        assert_eq!(after["properties"]["map"], json!({"type": "object"}));
    }

    #[test]
    fn what_the_schema_says_of_other_properties_is_kept() {
        for schema in [
            json!({"type": "object", "properties": {"a": {}}, "additionalProperties": true}),
            json!({"type": "object", "properties": {"a": {}}, "additionalProperties": {"type": "string"}}),
            json!({"type": "object", "properties": {"a": {}}, "patternProperties": {"^x": {}}}),
            json!({"type": "object", "properties": {"a": {}}, "propertyNames": {"maxLength": 3}}),
            json!({"type": "object", "properties": {"a": {}}, "unevaluatedProperties": {}}),
            json!({"type": "object", "properties": {"a": {}}, "required": ["b"]}),
            json!({"type": "object", "properties": {"a": {}}, "minProperties": 2}),
            json!({"type": "string", "properties": {"a": {}}}),
        ] {
            assert_eq!(closed(schema.clone()), schema);
        }
    }

    #[test]
    fn combined_schemas_stay_open() {
        let schema = json!({
            "allOf": [{"properties": {"a": {}}}, {"properties": {"b": {"type": "object", "properties": {"c": {}}}}}],
            "$defs": {
                "Base": {"type": "object", "properties": {"x": {}}},
                "Inner": {"type": "object", "properties": {"y": {}}},
                "Plain": {"type": "object", "properties": {"z": {}}}
            },
            "properties": {
                "extended": {"$ref": "#/$defs/Base", "properties": {"w": {}}},
                "chained": {"allOf": [{"$ref": "#/$defs/Inner"}]},
                "plain": {"$ref": "#/$defs/Plain", "description": "only an annotation"},
                "choice": {"properties": {"k": {}}, "anyOf": [{"properties": {"m": {}}}]}
            }
        });
        let after = closed(schema.clone());
        assert_eq!(after["allOf"], schema["allOf"]);
        assert_eq!(after["$defs"]["Base"], schema["$defs"]["Base"]);
        assert_eq!(after["$defs"]["Inner"], schema["$defs"]["Inner"]);
        assert_eq!(after["$defs"]["Plain"]["additionalProperties"], false);
        assert_eq!(
            after["properties"]["choice"],
            schema["properties"]["choice"]
        );
        // The root has `allOf` beside its properties.
        assert!(after.get("additionalProperties").is_none());
    }
}
