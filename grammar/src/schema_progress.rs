//! Whether a JSON Schema's local `$ref`s let a value ever be finished.
//!
//! A reference cycle can leave no way out: `{"$ref": "#"}`, two definitions naming each other,
//! an object that requires a property of its own type. llguidance compiles such a schema
//! without complaint into a grammar with no complete sentence; the first cycles find out only
//! when the first token mask comes out empty, the last never do (the model writes
//! `{"a": {"a": …` until its budget runs out). This check names the definition instead.
//!
//! It is the classic "productive symbols" fixed point over the reference targets: a target is
//! finishable once its schema can be satisfied using only targets already known finishable.
//! It is deliberately conservative: only what a value *must* pass through counts (`allOf`,
//! every branch of `anyOf`/`oneOf` failing, required properties and minimum items of a schema
//! whose `type` allows nothing but objects or arrays). Anything it does not understand counts
//! as finishable, so a valid schema is never refused here; the compiler still judges it.
//!
//! Walks recurse through the schema's nesting, so callers check the nesting cap first.

use std::collections::BTreeSet;

use serde_json::{Map, Value};

/// The local reference targets (JSON pointers, `""` for the root) whose schemas no finite
/// value satisfies, sorted, when the schema's root cannot be finished; empty when it can (or
/// when it fails for a reason other than its references, which the compiler reports itself).
pub(crate) fn unfinishable_references(schema: &Value) -> Vec<String> {
    let targets = reference_targets(schema);
    let mut finishable: BTreeSet<String> = BTreeSet::new();
    // Each pass settles at least one more target or stops; a settled target stays settled.
    loop {
        let before = finishable.len();
        for target in &targets {
            if finishable.contains(target) {
                continue;
            }
            let settled = match resolve(schema, target) {
                Some(resolved) => satisfiable(resolved, &finishable),
                // An anchor or a pointer we cannot follow: the compiler judges it.
                None => true,
            };
            if settled {
                finishable.insert(target.clone());
            }
        }
        if finishable.len() == before {
            break;
        }
    }
    if satisfiable(schema, &finishable) {
        return Vec::new();
    }
    targets.difference(&finishable).cloned().collect()
}

/// Whether `schema` can be satisfied by a finite value, given which reference targets are
/// known to be.
fn satisfiable(schema: &Value, finishable: &BTreeSet<String>) -> bool {
    let map = match schema {
        Value::Bool(b) => return *b,
        Value::Object(map) => map,
        // Not a schema: the compiler reports that.
        _ => return true,
    };
    if let Some(Value::String(reference)) = map.get("$ref")
        && let Some(pointer) = reference.strip_prefix('#')
        && !finishable.contains(pointer)
    {
        return false;
    }
    if let Some(Value::Array(all)) = map.get("allOf")
        && !all.iter().all(|s| satisfiable(s, finishable))
    {
        return false;
    }
    for key in ["anyOf", "oneOf"] {
        if let Some(Value::Array(options)) = map.get(key)
            && !options.is_empty()
            && !options.iter().any(|s| satisfiable(s, finishable))
        {
            return false;
        }
    }
    match only_type(map) {
        Some("object") => required_properties_satisfiable(map, finishable),
        Some("array") => minimum_items_satisfiable(map, finishable),
        _ => true,
    }
}

/// The one JSON type `type` allows, if it allows exactly one.
fn only_type(map: &Map<String, Value>) -> Option<&str> {
    match map.get("type")? {
        Value::String(t) => Some(t),
        Value::Array(types) if types.len() == 1 => types[0].as_str(),
        _ => None,
    }
}

/// Every required property's schema (its `properties` entry, else `additionalProperties`)
/// can be finished.
fn required_properties_satisfiable(
    map: &Map<String, Value>,
    finishable: &BTreeSet<String>,
) -> bool {
    let Some(Value::Array(required)) = map.get("required") else {
        return true;
    };
    let properties = map.get("properties").and_then(Value::as_object);
    required.iter().filter_map(Value::as_str).all(|name| {
        match properties.and_then(|p| p.get(name)) {
            Some(property) => satisfiable(property, finishable),
            // A `patternProperties` entry may cover it; leave that to the compiler.
            None if map.contains_key("patternProperties") => true,
            None => map
                .get("additionalProperties")
                .is_none_or(|extra| satisfiable(extra, finishable)),
        }
    })
}

/// The items an array needs at least (`minItems`) can be finished: the leading ones from
/// `prefixItems`, the rest from `items`.
fn minimum_items_satisfiable(map: &Map<String, Value>, finishable: &BTreeSet<String>) -> bool {
    let needed = map.get("minItems").and_then(Value::as_u64).unwrap_or(0);
    if needed == 0 {
        return true;
    }
    let prefix = map
        .get("prefixItems")
        .and_then(Value::as_array)
        .map_or(&[][..], Vec::as_slice);
    let from_prefix = prefix
        .len()
        .min(usize::try_from(needed).unwrap_or(usize::MAX));
    if !prefix[..from_prefix]
        .iter()
        .all(|s| satisfiable(s, finishable))
    {
        return false;
    }
    if (from_prefix as u64) < needed {
        return map
            .get("items")
            .is_none_or(|items| satisfiable(items, finishable));
    }
    true
}

/// The distinct local reference targets (JSON pointers, `""` for the root) anywhere in
/// `schema`.
fn reference_targets(schema: &Value) -> BTreeSet<String> {
    let mut targets = BTreeSet::new();
    let mut stack = vec![schema];
    while let Some(value) = stack.pop() {
        match value {
            Value::Object(map) => {
                if let Some(Value::String(target)) = map.get("$ref")
                    && let Some(pointer) = target.strip_prefix('#')
                {
                    targets.insert(pointer.to_string());
                }
                stack.extend(map.values());
            }
            Value::Array(items) => stack.extend(items),
            _ => {}
        }
    }
    targets
}

fn resolve<'a>(schema: &'a Value, pointer: &str) -> Option<&'a Value> {
    if pointer.is_empty() {
        Some(schema)
    } else {
        schema.pointer(pointer)
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use serde_json::json;

    #[test]
    fn references_with_no_way_out_are_named() {
        assert_eq!(
            unfinishable_references(&json!({"$ref": "#"})),
            vec![String::new()]
        );
        let pair = json!({"$defs": {"a": {"$ref": "#/$defs/b"}, "b": {"$ref": "#/$defs/a"}},
                          "$ref": "#/$defs/a"});
        assert_eq!(
            unfinishable_references(&pair),
            vec!["/$defs/a".to_string(), "/$defs/b".to_string()]
        );
        assert_eq!(
            unfinishable_references(&json!({"anyOf": [{"$ref": "#"}, {"allOf": [{"$ref": "#"}]}]})),
            vec![String::new()]
        );
        let requires_itself = json!({"type": "object", "properties": {"a": {"$ref": "#"}},
                                     "required": ["a"]});
        assert_eq!(
            unfinishable_references(&requires_itself),
            vec![String::new()]
        );
        let nonempty_list_of_itself = json!({"$defs": {"l": {"type": "array", "minItems": 1,
            "items": {"$ref": "#/$defs/l"}}}, "$ref": "#/$defs/l"});
        assert_eq!(
            unfinishable_references(&nonempty_list_of_itself),
            vec!["/$defs/l".to_string()]
        );
    }

    #[test]
    fn recursion_with_a_way_out_is_fine() {
        let tree = json!({"type": "object", "properties": {
            "children": {"type": "array", "items": {"$ref": "#"}}}});
        assert_eq!(unfinishable_references(&tree), Vec::<String>::new());
        // Required, but the list of children may be empty.
        let required_children = json!({"type": "object", "properties": {
            "children": {"type": "array", "items": {"$ref": "#"}}}, "required": ["children"]});
        assert_eq!(
            unfinishable_references(&required_children),
            Vec::<String>::new()
        );
        // A linked list: `next` may be null.
        let list = json!({"$defs": {"node": {"type": "object", "properties": {
            "next": {"anyOf": [{"type": "null"}, {"$ref": "#/$defs/node"}]}},
            "required": ["next"]}}, "$ref": "#/$defs/node"});
        assert_eq!(unfinishable_references(&list), Vec::<String>::new());
        // A self-reference that allows non-objects: `1` satisfies it.
        let loose = json!({"properties": {"a": {"$ref": "#"}}, "required": ["a"]});
        assert_eq!(unfinishable_references(&loose), Vec::<String>::new());
        // An unused cycle does not matter.
        let unused = json!({"$defs": {"a": {"$ref": "#/$defs/a"}}, "type": "string"});
        assert_eq!(unfinishable_references(&unused), Vec::<String>::new());
        // References it cannot follow are left to the compiler.
        assert_eq!(
            unfinishable_references(&json!({"$ref": "#anchor"})),
            Vec::<String>::new()
        );
        assert_eq!(
            unfinishable_references(&json!({"$ref": "other.json"})),
            Vec::<String>::new()
        );
    }
}
