//! Where the subschemas of a JSON Schema sit: every place a keyword holds a schema (as its
//! value, in an array, or as the values of a map), as JSON pointers, parents before children.
//! Values under other keywords (`const`, `enum`, `default`, `examples`, `x-…`) are data and
//! never visited, so a property named `not` is not mistaken for the keyword.
//!
//! The walk is iterative: schemas come from clients, and a deep one must not overflow the
//! stack of the thread walking it.

use serde_json::Value;

/// Keywords that apply other schemas to the same instance: beside them `unevaluated*` cannot
/// be rewritten as `additional*`, and an object cannot be closed.
pub(crate) const IN_PLACE: [&str; 11] = [
    "allOf",
    "anyOf",
    "oneOf",
    "$ref",
    "$dynamicRef",
    "$recursiveRef",
    "if",
    "then",
    "else",
    "dependentSchemas",
    "dependencies",
];

/// Keywords whose value is one schema (`items` may also be an array of them, in drafts
/// before 2020-12).
const ONE_SCHEMA: [&str; 12] = [
    "additionalProperties",
    "additionalItems",
    "items",
    "unevaluatedProperties",
    "unevaluatedItems",
    "contains",
    "propertyNames",
    "not",
    "if",
    "then",
    "else",
    "contentSchema",
];

/// Keywords whose value is an array of schemas.
const SCHEMA_ARRAYS: [&str; 5] = ["allOf", "anyOf", "oneOf", "prefixItems", "items"];

/// Keywords whose value maps names to schemas (`dependencies` also maps names to arrays of
/// property names, which are not schemas).
const SCHEMA_MAPS: [&str; 6] = [
    "properties",
    "patternProperties",
    "$defs",
    "definitions",
    "dependentSchemas",
    "dependencies",
];

/// One place in a schema that holds a schema.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Position {
    /// Its JSON pointer from the root (`""` for the root itself).
    pub pointer: String,
    /// The keyword of the nearest enclosing schema that holds it (`""` for the root): such
    /// as `properties`, `anyOf` or `not`.
    pub keyword: &'static str,
    /// The pointer of that enclosing schema.
    pub parent: String,
}

/// Every position in `schema` that holds a schema, the root first, each parent before its
/// children.
pub(crate) fn positions(schema: &Value) -> Vec<Position> {
    let mut out = Vec::new();
    let mut stack = vec![(
        schema,
        Position {
            pointer: String::new(),
            keyword: "",
            parent: String::new(),
        },
    )];
    while let Some((value, position)) = stack.pop() {
        let Value::Object(map) = value else {
            // `true`/`false` schemas hold nothing; anything else is not a schema at all.
            if value.is_boolean() {
                out.push(position);
            }
            continue;
        };
        let here = position.pointer.clone();
        out.push(position);
        let mut children = Vec::new();
        let child = |keyword: &'static str, path: String| Position {
            pointer: format!("{here}/{path}"),
            keyword,
            parent: here.clone(),
        };
        for keyword in ONE_SCHEMA {
            if let Some(sub) = map.get(keyword).filter(|v| v.is_object() || v.is_boolean()) {
                children.push((sub, child(keyword, escape(keyword))));
            }
        }
        for keyword in SCHEMA_ARRAYS {
            if let Some(Value::Array(items)) = map.get(keyword) {
                for (i, sub) in items.iter().enumerate() {
                    children.push((sub, child(keyword, format!("{}/{i}", escape(keyword)))));
                }
            }
        }
        for keyword in SCHEMA_MAPS {
            if let Some(Value::Object(entries)) = map.get(keyword) {
                for (name, sub) in entries {
                    if sub.is_object() || sub.is_boolean() {
                        let path = format!("{}/{}", escape(keyword), escape(name));
                        children.push((sub, child(keyword, path)));
                    }
                }
            }
        }
        // Reversed so that they come off the stack in document order.
        stack.extend(children.into_iter().rev());
    }
    out
}

/// `token` escaped for a JSON pointer (RFC 6901: `~` as `~0`, `/` as `~1`).
pub(crate) fn escape(token: &str) -> String {
    token.replace('~', "~0").replace('/', "~1")
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn every_subschema_is_found_and_data_is_not() {
        let schema = json!({
            "type": "object",
            "properties": {
                "not": {"type": "string", "default": {"properties": {"x": {}}}},
                "a/b": {"anyOf": [{"type": "null"}, true]}
            },
            "$defs": {"d": {"items": [{"const": {"not": 1}}]}},
            "dependencies": {"x": ["y"], "z": {"required": ["w"]}},
            "enum": [{"properties": {"ghost": {}}}]
        });
        let mut found: Vec<(String, &str)> = positions(&schema)
            .into_iter()
            .map(|p| (p.pointer, p.keyword))
            .collect();
        found.sort();
        let expected = [
            ("", ""),
            ("/$defs/d", "$defs"),
            ("/$defs/d/items/0", "items"),
            ("/dependencies/z", "dependencies"),
            ("/properties/a~1b", "properties"),
            ("/properties/a~1b/anyOf/0", "anyOf"),
            ("/properties/a~1b/anyOf/1", "anyOf"),
            ("/properties/not", "properties"),
        ];
        assert_eq!(
            found,
            expected
                .iter()
                .map(|(p, k)| (p.to_string(), *k))
                .collect::<Vec<_>>()
        );
        for (pointer, _) in &found {
            assert!(schema.pointer(pointer).is_some(), "{pointer}");
        }
    }

    #[test]
    fn parents_come_before_children() {
        let schema = json!({"anyOf": [{"properties": {"a": {"not": {}}}}]});
        let order: Vec<String> = positions(&schema).into_iter().map(|p| p.pointer).collect();
        assert_eq!(
            order,
            [
                "",
                "/anyOf/0",
                "/anyOf/0/properties/a",
                "/anyOf/0/properties/a/not"
            ]
        );
    }

    #[test]
    fn a_deep_schema_is_walked_without_recursion() {
        let mut deep = json!({"type": "string"});
        for _ in 0..2_000 {
            // Wrapped by hand: `json!({"not": deep})` serializes `deep` into the new value,
            // recursively, and 2,000 levels of that overflowed a test thread's stack.
            let mut wrapper = serde_json::Map::new();
            wrapper.insert("not".to_string(), deep);
            deep = Value::Object(wrapper);
        }
        assert_eq!(positions(&deep).len(), 2_001);
        // Dropping it recursively would overflow the stack too.
        std::mem::forget(deep);
    }
}
