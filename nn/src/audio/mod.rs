//! Audio encoders, one file each: log-mel frames in, one feature vector per encoder position
//! out. The families that use them (`arch/`) pool and project those features into their text
//! model's width. Whisper itself, the speech recognizer, is here too: its text decoder, the
//! encoder-decoder model, and greedy decoding of a window.

pub mod whisper;
pub mod whisper_decoder;
pub mod whisper_decoding;
pub mod whisper_model;
