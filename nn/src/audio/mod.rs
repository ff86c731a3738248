//! Audio encoders, one file each: log-mel frames in, one feature vector per encoder position
//! out. The families that use them (`arch/`) pool and project those features into their text
//! model's width.

pub mod whisper;
