//! JPEG pixels through libjpeg-turbo's decoder (as built by the `mozjpeg` crate), the decoder
//! Pillow links: the reference preprocessors open images with Pillow, and a JPEG's pixels
//! depend on how the decoder rounds its inverse DCT, chroma upsampling and colour conversion.
//! The `image` crate's decoder rounds them its own way (up to 4 grey levels from Pillow on the
//! fixture photo, a quarter of the values differing); this one gives Pillow's bytes exactly.
//!
//! Only the pixels come from here: the header (dimensions, EXIF orientation) is read and
//! checked by the `image` crate first, so the limits apply before libjpeg allocates anything,
//! and colour spaces libjpeg does not turn into RGB (CMYK, YCCK) stay with the `image` crate.
//!
//! libjpeg reports fatal errors by unwinding (the crate's error manager), caught here. It only
//! warns when the data ends early and fills the rest with grey; Pillow refuses such a file
//! ("image file is truncated"), and so do we, by watching the input run out.

use std::cell::Cell;
use std::io::{self, BufRead, Read};
use std::panic::{self, AssertUnwindSafe};

use image::RgbImage;
use mozjpeg::{ColorSpace, Decompress};

use crate::error::{Error, Result};

/// Most scans a JPEG may hold. Each progressive scan revisits the whole coefficient buffer, so
/// a small file of many tiny scans costs time out of all proportion to its size; real files
/// have one (baseline) or about ten (progressive).
const MAX_SCANS: usize = 500;

/// The pixels of a JPEG whose header passed the limits at `(width, height)`, as RGB, or
/// `None` when its colour space is one libjpeg does not convert to RGB.
pub(crate) fn decode_rgb(bytes: &[u8], width: u32, height: u32) -> Result<Option<RgbImage>> {
    let scans = count_scans(bytes);
    if scans > MAX_SCANS {
        return Err(refused(format!(
            "{scans} scans (start-of-scan markers); at most {MAX_SCANS} are accepted"
        )));
    }
    let ran_out = Cell::new(false);
    let input = WatchedInput {
        rest: bytes,
        ran_out: &ran_out,
    };
    let decoded = panic::catch_unwind(AssertUnwindSafe(|| -> io::Result<Option<Vec<u8>>> {
        let header = Decompress::new_reader(input)?;
        if !matches!(
            header.color_space(),
            ColorSpace::JCS_YCbCr | ColorSpace::JCS_GRAYSCALE | ColorSpace::JCS_RGB
        ) {
            return Ok(None);
        }
        if (header.width(), header.height()) != (width as usize, height as usize) {
            return Err(io::Error::other(format!(
                "libjpeg reads a {}x{} image where the header check read {width}x{height}",
                header.width(),
                header.height()
            )));
        }
        let mut started = header.rgb()?;
        let pixels = started.read_scanlines::<u8>()?;
        started.finish()?;
        Ok(Some(pixels))
    }));
    let pixels = match decoded {
        Ok(Ok(Some(pixels))) => pixels,
        Ok(Ok(None)) => return Ok(None),
        Ok(Err(e)) => return Err(refused(e.to_string())),
        Err(payload) => return Err(refused(panic_message(payload))),
    };
    if ran_out.get() {
        return Err(refused(
            "the data ends before the image does (truncated file)".into(),
        ));
    }
    match RgbImage::from_raw(width, height, pixels) {
        Some(image) => Ok(Some(image)),
        None => Err(refused(
            "libjpeg returned fewer rows than the image has".into(),
        )),
    }
}

fn refused(message: String) -> Error {
    Error::ImageDecode {
        format: "jpeg",
        message,
    }
}

/// What libjpeg's error exit unwound with (the crate formats its message as a `String`).
fn panic_message(payload: Box<dyn std::any::Any + Send>) -> String {
    match payload.downcast::<String>() {
        Ok(message) => *message,
        Err(payload) => match payload.downcast::<&'static str>() {
            Ok(message) => (*message).to_string(),
            Err(_) => "libjpeg failed".to_string(),
        },
    }
}

/// Start-of-scan markers (`FF DA`). Entropy-coded data never holds that pair (a data byte
/// `FF` is followed by a stuffed `00`), so this counts every real scan; a pair inside another
/// segment's payload (an EXIF thumbnail's own scans) only makes the count stricter.
fn count_scans(bytes: &[u8]) -> usize {
    bytes
        .windows(2)
        .filter(|pair| pair == &[0xFF, 0xDA])
        .count()
}

/// The whole file as libjpeg's input, noting whether libjpeg asked for bytes past its end
/// (it then warns, pretends an end-of-image marker and fills the missing rows with grey).
struct WatchedInput<'a> {
    rest: &'a [u8],
    ran_out: &'a Cell<bool>,
}

impl Read for WatchedInput<'_> {
    fn read(&mut self, buf: &mut [u8]) -> io::Result<usize> {
        let n = self.rest.read(buf)?;
        if n == 0 && !buf.is_empty() {
            self.ran_out.set(true);
        }
        Ok(n)
    }
}

impl BufRead for WatchedInput<'_> {
    fn fill_buf(&mut self) -> io::Result<&[u8]> {
        if self.rest.is_empty() {
            self.ran_out.set(true);
        }
        Ok(self.rest)
    }

    fn consume(&mut self, amount: usize) {
        self.rest = &self.rest[amount.min(self.rest.len())..];
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn scans_are_counted_outside_stuffed_data() {
        assert_eq!(
            count_scans(&[0xFF, 0xD8, 0xFF, 0xDA, 0x12, 0xFF, 0x00, 0xDA]),
            1
        );
        assert_eq!(count_scans(&[0xFF, 0xDA, 0xFF, 0xDA]), 2);
    }
}
