//! Resampling quality: what lies above the new Nyquist frequency is suppressed, and a tone
//! keeps its frequency and amplitude.

mod support;

use media::{AudioClip, resample};

/// Aliasing bound: content above the new Nyquist (plus a 500 Hz guard band for the filter's
/// transition) comes out at least this many dB below where it went in.
const STOPBAND_DB: f64 = -90.0;
/// Passband bound: content well below the new Nyquist keeps its level within this many dB.
const PASSBAND_DB: f64 = 0.1;

/// Linear chirp from `f0` to `f1` Hz over `seconds`, amplitude 0.5.
fn chirp(f0: f64, f1: f64, rate: u32, seconds: f64) -> Vec<f32> {
    let n = (seconds * f64::from(rate)) as usize;
    let k = (f1 - f0) / seconds;
    (0..n)
        .map(|i| {
            let t = i as f64 / f64::from(rate);
            (0.5 * (2.0 * std::f64::consts::PI * (f0 * t + 0.5 * k * t * t)).sin()) as f32
        })
        .collect()
}

fn rms(xs: &[f32]) -> f64 {
    (xs.iter().map(|&x| f64::from(x) * f64::from(x)).sum::<f64>() / xs.len() as f64).sqrt()
}

fn db(ratio: f64) -> f64 {
    20.0 * ratio.log10()
}

/// Sweeps 20 Hz to the input Nyquist and compares output and input level over the stretches
/// where the sweep is in the passband and in the stopband.
fn sweep_levels(from: u32, to: u32) -> (f64, f64) {
    let seconds = 8.0;
    let (f0, f1) = (20.0, f64::from(from) / 2.0);
    let input = AudioClip {
        samples: chirp(f0, f1, from, seconds),
        sample_rate: from,
    };
    let output = resample(&input, to).unwrap();
    let nyquist = f64::from(to) / 2.0;
    // The time at which the sweep passes frequency f.
    let time_at = |f: f64| (f - f0) / (f1 - f0) * seconds;
    let stretch = |clip: &[f32], rate: u32, lo: f64, hi: f64| {
        let a = (time_at(lo) * f64::from(rate)) as usize;
        let b = ((time_at(hi) * f64::from(rate)) as usize).min(clip.len());
        rms(&clip[a..b])
    };
    let pass = db(stretch(&output.samples, to, 200.0, 0.8 * nyquist)
        / stretch(&input.samples, from, 200.0, 0.8 * nyquist));
    let stop = db(stretch(&output.samples, to, nyquist + 500.0, f1 - 100.0)
        / stretch(&input.samples, from, nyquist + 500.0, f1 - 100.0));
    eprintln!("{from} -> {to}: passband {pass:+.3} dB, stopband {stop:.1} dB");
    (pass, stop)
}

#[test]
fn sweep_48k_to_16k_has_no_energy_above_new_nyquist() {
    let (pass, stop) = sweep_levels(48_000, 16_000);
    assert!(
        pass.abs() < PASSBAND_DB,
        "passband level changed by {pass} dB"
    );
    assert!(stop < STOPBAND_DB, "aliased energy at {stop} dB");
}

#[test]
fn sweep_through_the_sinc_path_is_band_limited_too() {
    // 44 101 Hz and 16 kHz share no useful period, so this takes the windowed-sinc resampler.
    let (pass, stop) = sweep_levels(44_101, 16_000);
    assert!(
        pass.abs() < PASSBAND_DB,
        "passband level changed by {pass} dB"
    );
    assert!(stop < STOPBAND_DB, "aliased energy at {stop} dB");
}

/// Frequency from interpolated upward zero crossings, amplitude from RMS, both away from the
/// clip's edges.
fn tone_of(clip: &AudioClip) -> (f64, f64) {
    let edge = clip.sample_rate as usize / 10;
    let xs = &clip.samples[edge..clip.samples.len() - edge];
    let mut crossings = Vec::new();
    for i in 1..xs.len() {
        let (a, b) = (f64::from(xs[i - 1]), f64::from(xs[i]));
        if a < 0.0 && b >= 0.0 {
            crossings.push((i - 1) as f64 + a / (a - b));
        }
    }
    let span = crossings.last().unwrap() - crossings.first().unwrap();
    let freq = (crossings.len() - 1) as f64 / span * f64::from(clip.sample_rate);
    (freq, rms(xs) * std::f64::consts::SQRT_2)
}

#[test]
fn a_1khz_tone_keeps_frequency_and_amplitude() {
    for from in [48_000, 44_100, 22_050, 8_000, 44_101] {
        let input = AudioClip {
            samples: support::sine(1_000.0, 0.5, from, 2.0),
            sample_rate: from,
        };
        let output = resample(&input, 16_000).unwrap();
        let (freq, amp) = tone_of(&output);
        eprintln!("{from} -> 16000: {freq:.4} Hz, amplitude {amp:.5}");
        assert!((freq - 1_000.0).abs() < 0.01, "{from}: frequency {freq}");
        assert!((amp - 0.5).abs() < 0.0005, "{from}: amplitude {amp}");
    }
}
