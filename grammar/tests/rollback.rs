//! Rollback restores exactly the earlier masks: along random valid token paths (seeded walks
//! through the masks), consuming then rolling back any suffix gives back the mask recorded at
//! that point, and replaying the suffix gives back the later masks too.

mod support;

use grammar::{GrammarCompiler, GrammarSpec};
use proptest::prelude::*;
use rand::rngs::StdRng;
use rand::{Rng, SeedableRng};
use serde_json::json;
use support::{allowed, smollm2_compiler};

fn specs() -> Vec<GrammarSpec> {
    vec![
        GrammarSpec::JsonObject,
        GrammarSpec::JsonSchema(json!({
            "type": "object",
            "properties": {
                "tags": {"type": "array", "items": {"enum": ["a", "bb", "ccc"]}, "maxItems": 4},
                "n": {"type": "integer", "minimum": 0, "maximum": 99}
            },
            "required": ["tags", "n"],
            "additionalProperties": false
        })),
        GrammarSpec::Regex("(yes|no)( [0-9]{1,3}){0,4}".into()),
        GrammarSpec::AfterThinking {
            open: "<think>".into(),
            close: "</think>".into(),
            already_open: true,
            then: Box::new(GrammarSpec::JsonObject),
        },
        GrammarSpec::ToolCalls {
            open: "<tool_call>".into(),
            close: "</tool_call>".into(),
            calls: vec![json!({"type": "object", "properties": {"name": {"const": "f"}}})],
            required: true,
            parallel: true,
        },
    ]
}

fn compiler() -> Option<&'static GrammarCompiler> {
    static COMPILER: std::sync::OnceLock<Option<GrammarCompiler>> = std::sync::OnceLock::new();
    COMPILER.get_or_init(smollm2_compiler).as_ref()
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(40))]

    #[test]
    fn rolling_back_any_suffix_restores_the_masks(
        spec_index in 0usize..5,
        seed in any::<u64>(),
        steps in 1usize..40,
        back_fraction in 0.0f64..=1.0,
    ) {
        let Some(compiler) = compiler() else {
            return Ok(());
        };
        let spec = &specs()[spec_index];
        let mut g = compiler.compile(spec).unwrap();
        let mut rng = StdRng::seed_from_u64(seed);
        // masks[i] is the mask after i tokens; the walk may take an end token, which ends it.
        let mut masks = vec![g.mask().unwrap()];
        let mut path = Vec::new();
        for _ in 0..steps {
            let options = allowed(masks.last().unwrap(), g.vocab_size());
            let pick = options[rng.random_range(0..options.len())];
            g.consume(pick).unwrap();
            path.push(pick);
            masks.push(g.mask().unwrap());
            if compiler.end_tokens().contains(&pick) {
                break;
            }
        }
        let back = ((path.len() as f64) * back_fraction).round() as usize;
        g.rollback(back).unwrap();
        let kept = path.len() - back;
        prop_assert_eq!(&g.mask().unwrap(), &masks[kept]);
        for (i, &t) in path[kept..].iter().enumerate() {
            g.consume(t).unwrap();
            prop_assert_eq!(&g.mask().unwrap(), &masks[kept + i + 1]);
        }
        // Rolling back in single steps visits every earlier mask.
        for i in (0..path.len()).rev() {
            g.rollback(1).unwrap();
            prop_assert_eq!(&g.mask().unwrap(), &masks[i]);
        }
    }
}
