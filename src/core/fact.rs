//! Facts: the immutable, self-describing records a run is made of.
//!
//! This module owns the wire format of one fact (one JSON object, one line) and its schema
//! version. It never does I/O and never reads a clock: time arrives as data (`at_ms`).
//!
//! Wire format, one object per line, keys in this order:
//!
//! ```json
//! {"v":1,"seq":3,"at_ms":1764400000000,"kind":"tool.result","data":{"call_id":"c1","output":"ok","is_error":false,"duration_ms":12}}
//! ```
//!
//! `v` is the schema version the fact was written with. Readers accept every version up to
//! [`SCHEMA_VERSION`] and refuse a newer one with an error naming both. Unknown fields inside
//! `data` or the envelope are ignored, so a newer *minor* change that only adds optional
//! fields stays readable.

use std::fmt;

use serde::de::{self, IgnoredAny, MapAccess, Visitor};
use serde::ser::SerializeStruct;
use serde::{Deserialize, Deserializer, Serialize, Serializer};

use crate::core::fingerprint::Fingerprint;

/// The newest fact schema this build reads and the one it writes.
pub const SCHEMA_VERSION: u32 = 1;

/// Largest encoded fact (one JSONL line, without its newline) accepted on write or read.
///
/// A bound keeps a single runaway tool output from exhausting memory on every node that later
/// loads the run; hosts truncate larger outputs before recording them.
pub const MAX_FACT_BYTES: usize = 8 * 1024 * 1024;

macro_rules! string_id {
    ($(#[$doc:meta])* $name:ident) => {
        $(#[$doc])*
        #[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
        #[serde(transparent)]
        pub struct $name(pub String);

        impl $name {
            /// Wraps `id` as this kind of ID.
            pub fn new(id: impl Into<String>) -> Self {
                Self(id.into())
            }

            /// The ID's text, as facts and keys carry it.
            pub fn as_str(&self) -> &str {
                &self.0
            }
        }

        impl fmt::Display for $name {
            fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(&self.0)
            }
        }
    };
}

string_id!(
    /// Identifies one agent run.
    RunId
);
string_id!(
    /// Identifies a conversation that may own several runs.
    SessionId
);
string_id!(
    /// Identifies one tool call inside a model turn (as the model named it).
    CallId
);
string_id!(
    /// Identifies a question the run asked a human.
    QuestionId
);
string_id!(
    /// The host-chosen ID of a recovery: the continuation of an interrupted run.
    RecoveryId
);

/// Position of a fact in its run: 1 for `meta`, then one more per fact, no gaps.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Hash, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Seq(pub u64);

impl fmt::Display for Seq {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}", self.0)
    }
}

/// One immutable record of a run.
#[derive(Clone, Debug, PartialEq)]
pub struct Fact {
    /// The fact's position in its run.
    pub seq: Seq,
    /// Wall-clock time the host recorded, as data. The fold never compares it with a clock.
    pub at_ms: u64,
    /// What happened.
    pub body: FactBody,
}

/// What happened. Names are past tense; the wire name is the `kind` string.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "kind", content = "data")]
pub enum FactBody {
    /// Boxed: it is the largest body and occurs once per run, so keeping it out of line
    /// halves the size of every other fact.
    #[serde(rename = "meta")]
    Meta(Box<Meta>),
    /// The user gave the run input: its prompt, or more after a final answer.
    #[serde(rename = "user.message")]
    UserMessage(UserMessage),
    /// The model answered one turn.
    #[serde(rename = "model.turn")]
    ModelTurn(ModelTurn),
    /// A tool call of the last model turn returned (or was denied).
    #[serde(rename = "tool.result")]
    ToolResult(ToolResult),
    /// A tool call needs a human's approval before it runs; the run parks.
    #[serde(rename = "confirmation.requested")]
    ConfirmationRequested(ConfirmationRequested),
    /// A human approved or denied the call the run parked on.
    #[serde(rename = "confirmation.answered")]
    ConfirmationAnswered(ConfirmationAnswered),
    /// The run asked a human a question; the run parks.
    #[serde(rename = "question.asked")]
    QuestionAsked(QuestionAsked),
    /// A human answered the question the run parked on.
    #[serde(rename = "question.answered")]
    QuestionAnswered(QuestionAnswered),
    /// The run ended; nothing may follow.
    #[serde(rename = "terminal")]
    Terminal(Terminal),
}

impl FactBody {
    /// The wire name of this fact's kind, for messages.
    pub fn kind(&self) -> &'static str {
        match self {
            FactBody::Meta(_) => "meta",
            FactBody::UserMessage(_) => "user.message",
            FactBody::ModelTurn(_) => "model.turn",
            FactBody::ToolResult(_) => "tool.result",
            FactBody::ConfirmationRequested(_) => "confirmation.requested",
            FactBody::ConfirmationAnswered(_) => "confirmation.answered",
            FactBody::QuestionAsked(_) => "question.asked",
            FactBody::QuestionAnswered(_) => "question.answered",
            FactBody::Terminal(_) => "terminal",
        }
    }
}

/// Always the first fact (seq 1): who the run is and what configuration started it.
/// The schema version of the run is the `v` of this fact.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Meta {
    /// The run these facts belong to; recoveries keep it.
    pub run_id: RunId,
    /// The conversation the run belongs to, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub session_id: Option<SessionId>,
    /// The configuration the run was started with, checked by the resume guard.
    pub fingerprint: Fingerprint,
}

/// Input from the user: the run's prompt, or more after a final answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct UserMessage {
    /// The message text, shown to the model as a user message.
    pub content: String,
}

/// One assistant turn exactly as the model returned it, with its token usage.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ModelTurn {
    /// The text the model answered, if any; a turn without tool calls is the final answer.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub content: Option<String>,
    /// The tool calls the model requested, in the order it made them.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub tool_calls: Vec<ToolCall>,
    /// The model's reasoning text, when it returned one.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub reasoning: Option<String>,
    /// The tokens the turn spent, counted against the token budget.
    #[serde(default)]
    pub usage: Usage,
}

/// One tool call the model requested in a turn.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolCall {
    /// The call's ID as the model named it; its result and confirmation refer to it.
    pub id: CallId,
    /// The name of the tool to call.
    pub name: String,
    /// The arguments verbatim as the model produced them (a JSON document in a string, as
    /// chat-completions APIs return it; it may be invalid JSON and is kept as-is).
    pub arguments: String,
}

/// The tokens one model turn spent, as the model reported them.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Usage {
    /// Tokens the model read as input.
    pub input_tokens: u64,
    /// Tokens the model generated.
    pub output_tokens: u64,
}

/// What one tool call of the last model turn returned.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ToolResult {
    /// The pending call this result answers.
    pub call_id: CallId,
    /// What the tool returned (or why it did not run), as the model will be shown it.
    pub output: String,
    /// Whether the call failed or was denied; counted in the run's tool errors.
    #[serde(default)]
    pub is_error: bool,
    /// How long the tool ran, in milliseconds (0 when it did not run).
    #[serde(default)]
    pub duration_ms: u64,
}

/// A tool call waits for a human's approval before it may run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ConfirmationRequested {
    /// The pending call that waits for approval.
    pub call_id: CallId,
    /// What the human is asked to approve.
    pub prompt: String,
}

/// A human's answer to a confirmation request; the run unparks.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct ConfirmationAnswered {
    /// The call the run parked on.
    pub call_id: CallId,
    /// Whether the call may run; a denied call gets an error result instead.
    pub approved: bool,
    /// The human's remark on the decision, if any.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub note: Option<String>,
}

/// The run asked a human a free-form question and waits for the answer.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QuestionAsked {
    /// The question's ID, which its answer names.
    pub question_id: QuestionId,
    /// The question as the human reads it.
    pub text: String,
}

/// A human's answer to the question the run parked on; the run continues with it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct QuestionAnswered {
    /// The question this answers.
    pub question_id: QuestionId,
    /// The answer, shown to the model as a user message.
    pub text: String,
}

/// The run ended. Nothing may follow it.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
pub struct Terminal {
    /// How the run ended.
    pub outcome: Outcome,
    /// Why the run ended, in words.
    #[serde(default)]
    pub message: String,
}

/// How a run ended, as its terminal fact records it.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum Outcome {
    /// The model gave its final answer.
    Completed,
    /// The run stopped on an error.
    Failed,
    /// The run was stopped on request before it finished.
    Cancelled,
    /// A token or iteration budget ran out.
    Budget,
    /// The per-resume step cap was reached and the host chose to stop there.
    StepCap,
    /// Recovery failed too often and the run was set aside with its last error.
    DeadLettered,
}

impl fmt::Display for Outcome {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Outcome::Completed => "completed",
            Outcome::Failed => "failed",
            Outcome::Cancelled => "cancelled",
            Outcome::Budget => "budget",
            Outcome::StepCap => "step_cap",
            Outcome::DeadLettered => "dead_lettered",
        })
    }
}

/// Why one encoded fact could not be decoded.
#[derive(Debug, thiserror::Error)]
pub enum DecodeError {
    #[error("schema version {found} is newer than this build reads (up to {supported})")]
    /// The fact was written with a newer schema than this build reads.
    FutureSchema {
        /// The schema version the fact was written with.
        found: u32,
        /// The newest schema version this build reads.
        supported: u32,
    },
    #[error("fact is {size} bytes, over the limit of {limit} bytes")]
    /// The encoded fact is over [`MAX_FACT_BYTES`].
    TooLarge {
        /// The encoded fact's size in bytes.
        size: usize,
        /// The largest encoded fact accepted, in bytes.
        limit: usize,
    },
    /// `syntax` is true when the text is not even complete JSON (cut off or garbage), as a
    /// torn write leaves it; false when it is JSON of the wrong shape.
    #[error("not a valid fact: {reason}")]
    Invalid {
        /// What is wrong with the text, as the parser reported it.
        reason: String,
        /// Whether the text is not even complete JSON.
        syntax: bool,
    },
}

/// Decodes one fact from its JSON text (one line, without the newline).
pub fn decode(text: &[u8]) -> Result<Fact, DecodeError> {
    if text.len() > MAX_FACT_BYTES {
        return Err(DecodeError::TooLarge {
            size: text.len(),
            limit: MAX_FACT_BYTES,
        });
    }
    match serde_json::from_slice::<Fact>(text) {
        Ok(fact) => Ok(fact),
        Err(error) => {
            // Only on the error path: tell a future schema apart from damage, so the caller
            // gets the error that names both versions rather than a confusing parse error.
            #[derive(Deserialize)]
            struct VersionOnly {
                v: Option<u32>,
            }
            if let Ok(VersionOnly { v: Some(found) }) = serde_json::from_slice(text)
                && found > SCHEMA_VERSION
            {
                return Err(DecodeError::FutureSchema {
                    found,
                    supported: SCHEMA_VERSION,
                });
            }
            let syntax = matches!(
                error.classify(),
                serde_json::error::Category::Eof | serde_json::error::Category::Syntax
            );
            Err(DecodeError::Invalid {
                reason: error.to_string(),
                syntax,
            })
        }
    }
}

/// Encodes one fact as one JSON line (without the newline), refusing oversized facts.
pub fn encode(fact: &Fact) -> Result<Vec<u8>, DecodeError> {
    let bytes = serde_json::to_vec(fact).map_err(|error| DecodeError::Invalid {
        reason: error.to_string(),
        syntax: false,
    })?;
    if bytes.len() > MAX_FACT_BYTES {
        return Err(DecodeError::TooLarge {
            size: bytes.len(),
            limit: MAX_FACT_BYTES,
        });
    }
    Ok(bytes)
}

impl Serialize for Fact {
    fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        /// Serializes only the `data` part of an adjacently tagged body.
        struct Data<'a>(&'a FactBody);
        impl Serialize for Data<'_> {
            fn serialize<S: Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
                match self.0 {
                    FactBody::Meta(x) => x.serialize(serializer),
                    FactBody::UserMessage(x) => x.serialize(serializer),
                    FactBody::ModelTurn(x) => x.serialize(serializer),
                    FactBody::ToolResult(x) => x.serialize(serializer),
                    FactBody::ConfirmationRequested(x) => x.serialize(serializer),
                    FactBody::ConfirmationAnswered(x) => x.serialize(serializer),
                    FactBody::QuestionAsked(x) => x.serialize(serializer),
                    FactBody::QuestionAnswered(x) => x.serialize(serializer),
                    FactBody::Terminal(x) => x.serialize(serializer),
                }
            }
        }
        let mut out = serializer.serialize_struct("Fact", 5)?;
        out.serialize_field("v", &SCHEMA_VERSION)?;
        out.serialize_field("seq", &self.seq)?;
        out.serialize_field("at_ms", &self.at_ms)?;
        out.serialize_field("kind", self.body.kind())?;
        out.serialize_field("data", &Data(&self.body))?;
        out.end()
    }
}

/// The `kind` strings, parsed without allocating.
#[derive(Clone, Copy, Deserialize)]
enum Kind {
    #[serde(rename = "meta")]
    Meta,
    #[serde(rename = "user.message")]
    UserMessage,
    #[serde(rename = "model.turn")]
    ModelTurn,
    #[serde(rename = "tool.result")]
    ToolResult,
    #[serde(rename = "confirmation.requested")]
    ConfirmationRequested,
    #[serde(rename = "confirmation.answered")]
    ConfirmationAnswered,
    #[serde(rename = "question.asked")]
    QuestionAsked,
    #[serde(rename = "question.answered")]
    QuestionAnswered,
    #[serde(rename = "terminal")]
    Terminal,
}

impl Kind {
    fn body_from<'de, A: MapAccess<'de>>(self, map: &mut A) -> Result<FactBody, A::Error> {
        Ok(match self {
            Kind::Meta => FactBody::Meta(map.next_value()?),
            Kind::UserMessage => FactBody::UserMessage(map.next_value()?),
            Kind::ModelTurn => FactBody::ModelTurn(map.next_value()?),
            Kind::ToolResult => FactBody::ToolResult(map.next_value()?),
            Kind::ConfirmationRequested => FactBody::ConfirmationRequested(map.next_value()?),
            Kind::ConfirmationAnswered => FactBody::ConfirmationAnswered(map.next_value()?),
            Kind::QuestionAsked => FactBody::QuestionAsked(map.next_value()?),
            Kind::QuestionAnswered => FactBody::QuestionAnswered(map.next_value()?),
            Kind::Terminal => FactBody::Terminal(map.next_value()?),
        })
    }

    fn body_from_value<E: de::Error>(self, data: serde_json::Value) -> Result<FactBody, E> {
        fn from<T: de::DeserializeOwned, E: de::Error>(value: serde_json::Value) -> Result<T, E> {
            serde_json::from_value(value).map_err(E::custom)
        }
        Ok(match self {
            Kind::Meta => FactBody::Meta(from(data)?),
            Kind::UserMessage => FactBody::UserMessage(from(data)?),
            Kind::ModelTurn => FactBody::ModelTurn(from(data)?),
            Kind::ToolResult => FactBody::ToolResult(from(data)?),
            Kind::ConfirmationRequested => FactBody::ConfirmationRequested(from(data)?),
            Kind::ConfirmationAnswered => FactBody::ConfirmationAnswered(from(data)?),
            Kind::QuestionAsked => FactBody::QuestionAsked(from(data)?),
            Kind::QuestionAnswered => FactBody::QuestionAnswered(from(data)?),
            Kind::Terminal => FactBody::Terminal(from(data)?),
        })
    }
}

#[derive(Deserialize)]
#[serde(field_identifier, rename_all = "snake_case")]
enum Field {
    V,
    Seq,
    AtMs,
    Kind,
    Data,
    #[serde(other)]
    Other,
}

/// Decodes the envelope by hand so that `data` goes straight into the right body type when
/// `kind` precedes it (as every writer of this format emits it): serde's generic tagged-enum
/// path would buffer every fact into an intermediate tree first, roughly halving throughput.
impl<'de> Deserialize<'de> for Fact {
    fn deserialize<D: Deserializer<'de>>(deserializer: D) -> Result<Self, D::Error> {
        struct FactVisitor;
        impl<'de> Visitor<'de> for FactVisitor {
            type Value = Fact;

            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str("a fact object with v, seq, at_ms, kind and data")
            }

            fn visit_map<A: MapAccess<'de>>(self, mut map: A) -> Result<Fact, A::Error> {
                let mut version: Option<u32> = None;
                let mut seq: Option<Seq> = None;
                let mut at_ms: Option<u64> = None;
                let mut kind: Option<Kind> = None;
                let mut body: Option<FactBody> = None;
                let mut early_data: Option<serde_json::Value> = None;
                while let Some(field) = map.next_key::<Field>()? {
                    match field {
                        Field::V => {
                            let found: u32 = map.next_value()?;
                            if found > SCHEMA_VERSION {
                                return Err(de::Error::custom(format_args!(
                                    "schema version {found} is newer than this build reads (up to {SCHEMA_VERSION})"
                                )));
                            }
                            version = Some(found);
                        }
                        Field::Seq => seq = Some(map.next_value()?),
                        Field::AtMs => at_ms = Some(map.next_value()?),
                        Field::Kind => kind = Some(map.next_value()?),
                        Field::Data => match kind {
                            Some(kind) => body = Some(kind.body_from(&mut map)?),
                            None => early_data = Some(map.next_value()?),
                        },
                        Field::Other => {
                            map.next_value::<IgnoredAny>()?;
                        }
                    }
                }
                let version = version.ok_or_else(|| de::Error::missing_field("v"))?;
                let seq = seq.ok_or_else(|| de::Error::missing_field("seq"))?;
                let at_ms = at_ms.ok_or_else(|| de::Error::missing_field("at_ms"))?;
                let kind = kind.ok_or_else(|| de::Error::missing_field("kind"))?;
                let body = match (body, early_data) {
                    (Some(body), _) => body,
                    (None, Some(data)) => kind.body_from_value(data)?,
                    (None, None) => return Err(de::Error::missing_field("data")),
                };
                upgrade(version, Fact { seq, at_ms, body }).map_err(de::Error::custom)
            }
        }
        deserializer.deserialize_map(FactVisitor)
    }
}

/// Brings a fact written with an older schema version up to [`SCHEMA_VERSION`].
///
/// Version 1 is the first published schema, so there is nothing to convert yet; a version 0
/// never existed and is refused. When version 2 arrives, its conversion from 1 goes here and
/// keeps every older log readable (invariant 9).
fn upgrade(version: u32, fact: Fact) -> Result<Fact, String> {
    match version {
        SCHEMA_VERSION => Ok(fact),
        other => Err(format!(
            "schema version {other} was never written by any build of this format (versions 1 to {SCHEMA_VERSION} exist)"
        )),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn tool_result(seq: u64) -> Fact {
        Fact {
            seq: Seq(seq),
            at_ms: 1_764_400_000_000,
            body: FactBody::ToolResult(ToolResult {
                call_id: CallId::new("c1"),
                output: "hello \"world\"\n".into(),
                is_error: false,
                duration_ms: 12,
            }),
        }
    }

    // Proves the wire format round-trips and keeps kind before data.
    #[test]
    fn encode_then_decode_round_trips() {
        let fact = tool_result(3);
        let bytes = encode(&fact).unwrap();
        let text = std::str::from_utf8(&bytes).unwrap();
        assert!(
            text.starts_with(
                r#"{"v":1,"seq":3,"at_ms":1764400000000,"kind":"tool.result","data":{"#
            )
        );
        assert_eq!(decode(&bytes).unwrap(), fact);
    }

    // Proves a reader refuses a newer schema and names both versions.
    #[test]
    fn future_schema_is_refused_naming_both_versions() {
        let line = br#"{"v":7,"seq":1,"at_ms":0,"kind":"user.message","data":{"content":"x"}}"#;
        let error = decode(line).unwrap_err();
        assert!(matches!(
            error,
            DecodeError::FutureSchema {
                found: 7,
                supported: 1
            }
        ));
        assert_eq!(
            error.to_string(),
            "schema version 7 is newer than this build reads (up to 1)"
        );
    }

    // Proves a newer schema is named even when the new format would not parse as ours.
    #[test]
    fn future_schema_with_unknown_kind_still_names_versions() {
        let line = br#"{"seq":1,"v":2,"kind":"brand.new","data":{}}"#;
        assert!(matches!(
            decode(line).unwrap_err(),
            DecodeError::FutureSchema {
                found: 2,
                supported: 1
            }
        ));
    }

    // Proves unknown optional fields (a newer minor change) are tolerated.
    #[test]
    fn unknown_fields_are_ignored() {
        let line = br#"{"v":1,"seq":2,"at_ms":5,"trace":"t","kind":"user.message","data":{"content":"hi","lang":"en"}}"#;
        let fact = decode(line).unwrap();
        assert_eq!(
            fact.body,
            FactBody::UserMessage(UserMessage {
                content: "hi".into()
            })
        );
    }

    // Proves data may precede kind (a hand-edited or foreign-ordered line still decodes).
    #[test]
    fn data_before_kind_decodes() {
        let line = br#"{"data":{"content":"hi"},"kind":"user.message","v":1,"seq":2,"at_ms":5}"#;
        assert_eq!(decode(line).unwrap().seq, Seq(2));
    }

    // Proves damage is reported as invalid, not as a schema problem.
    #[test]
    fn damaged_or_unknown_facts_are_invalid() {
        for line in [
            &br#"{"v":1,"seq":2,"at_ms":5,"kind":"user.message","data":{"content":"#[..],
            br#"{"v":1,"seq":2,"at_ms":5,"kind":"launch.missiles","data":{}}"#,
            br#"{"v":0,"seq":2,"at_ms":5,"kind":"user.message","data":{"content":"x"}}"#,
            br#"{"seq":2,"at_ms":5,"kind":"user.message","data":{"content":"x"}}"#,
            b"[1,2,3]",
        ] {
            assert!(
                matches!(decode(line), Err(DecodeError::Invalid { .. })),
                "{}",
                String::from_utf8_lossy(line)
            );
        }
    }

    // Proves the documented size limit is enforced on both sides.
    #[test]
    fn oversized_facts_are_refused() {
        let mut fact = tool_result(2);
        if let FactBody::ToolResult(result) = &mut fact.body {
            result.output = "x".repeat(MAX_FACT_BYTES);
        }
        assert!(matches!(encode(&fact), Err(DecodeError::TooLarge { .. })));
        let big = vec![b' '; MAX_FACT_BYTES + 1];
        assert!(matches!(decode(&big), Err(DecodeError::TooLarge { .. })));
    }
}
