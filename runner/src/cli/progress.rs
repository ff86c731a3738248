//! Progress on the terminal while models are pulled, imported, created or loaded.

use indicatif::{MultiProgress, ProgressBar, ProgressStyle};

use crate::pull::PullProgress;

/// A status line, a byte bar for pulls, imports and loads, and a count bar (tensors
/// quantized by `create`) once something is counted.
pub(super) struct Bars {
    bars: MultiProgress,
    bytes: ProgressBar,
    count: std::cell::OnceCell<ProgressBar>,
}

impl Bars {
    pub(super) fn new() -> Bars {
        let bars = MultiProgress::new();
        let bytes = bars.add(ProgressBar::new(0));
        bytes.set_style(
            ProgressStyle::with_template("{msg:30} {bar:30} {bytes}/{total_bytes} {bytes_per_sec}")
                .unwrap_or_else(|_| ProgressStyle::default_bar()),
        );
        Bars {
            bars,
            bytes,
            count: std::cell::OnceCell::new(),
        }
    }

    pub(super) fn update(&self, progress: PullProgress) {
        match progress {
            PullProgress::Status(status) => {
                // Printed above the bars; a closed terminal is no reason to fail the pull.
                let _ = self.bars.println(status);
            }
            PullProgress::Count { what, done, total } => {
                let bar = self.count.get_or_init(|| {
                    let bar = self
                        .bars
                        .insert_before(&self.bytes, ProgressBar::new(total));
                    bar.set_style(
                        ProgressStyle::with_template("{msg:30} {bar:30} {pos}/{len} eta {eta}")
                            .unwrap_or_else(|_| ProgressStyle::default_bar()),
                    );
                    bar
                });
                bar.set_message(what);
                bar.set_length(total.max(done));
                bar.set_position(done);
            }
            PullProgress::Bytes { what, done, total } => {
                self.bytes.set_message(what);
                self.bytes.set_length(total.max(done));
                self.bytes.set_position(done);
            }
        }
    }

    pub(super) fn finish(&self) {
        if let Some(count) = self.count.get() {
            count.finish_and_clear();
        }
        self.bytes.finish_and_clear();
    }
}
