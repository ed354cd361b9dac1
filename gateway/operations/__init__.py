"""Operations on sessions that the CLI and the admin UI share, so each has one home: list
sessions with their token pressure, show a session, explain its limits, compact it, undo a
compaction, compact a transcript file, export and import sessions, search a session's
archived (compacted) messages.

Each operation takes an open `Gateway` (the admin UI passes the live one); the `*_session`
wrappers open a gateway from a config for one CLI command. Each returns a typed result whose
`to_json()` is what `--json` prints.
"""

from gateway.operations.common import opened
from gateway.operations.compaction import (
    CompactionReport,
    SessionCompaction,
    Uncompaction,
    UndoneCompaction,
    compact,
    compact_all,
    compact_session,
    uncompact_session,
)
from gateway.operations.explain import (
    Explanation,
    LastCompaction,
    explain,
    explain_session,
    preview,
)
from gateway.operations.sessions import (
    CompactionEntry,
    CompactionMark,
    FlushMark,
    NextTrigger,
    PromptCache,
    SessionDetail,
    SessionOverview,
    ShownMessage,
    TokenHistory,
    TurnTokens,
    list_sessions,
    next_trigger,
    pressure_tokens,
    search_history,
    search_session_history,
    session_detail,
    session_overview,
    show_session,
    token_history,
)
from gateway.operations.transcripts import (
    ImportReport,
    TranscriptCompaction,
    TranscriptError,
    compact_transcript,
    export_messages,
    export_session,
    import_key,
    import_messages,
    import_session,
    read_transcript,
)

__all__ = [
    "CompactionEntry",
    "CompactionMark",
    "CompactionReport",
    "Explanation",
    "FlushMark",
    "ImportReport",
    "LastCompaction",
    "NextTrigger",
    "PromptCache",
    "SessionCompaction",
    "SessionDetail",
    "SessionOverview",
    "ShownMessage",
    "TokenHistory",
    "TranscriptCompaction",
    "TranscriptError",
    "TurnTokens",
    "Uncompaction",
    "UndoneCompaction",
    "compact",
    "compact_all",
    "compact_session",
    "compact_transcript",
    "explain",
    "explain_session",
    "export_messages",
    "export_session",
    "import_key",
    "import_messages",
    "import_session",
    "list_sessions",
    "next_trigger",
    "opened",
    "pressure_tokens",
    "preview",
    "read_transcript",
    "search_history",
    "search_session_history",
    "session_detail",
    "session_overview",
    "show_session",
    "token_history",
    "uncompact_session",
]
