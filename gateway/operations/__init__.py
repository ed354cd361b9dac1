"""Operations on sessions that the CLI and the admin UI share, so each has one home: list
sessions with their token pressure, show a session, explain its limits, compact it, undo a
compaction, compact a transcript file, export and import sessions, search a session's
archived (compacted) messages.

Each operation takes an open `Gateway` (the admin UI passes the live one); the `*_session`
wrappers open a gateway from a config for one CLI command. Each returns a typed result whose
`to_json()` is what `--json` prints.

The names are loaded when first used (gateway/lazy.py): `sessions list` imports the sessions
operations alone, not the gateway behind `compact` or `explain`.
"""

from typing import TYPE_CHECKING

from gateway.lazy import lazy_exports

if TYPE_CHECKING:
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
        explain_session,
        preview,
        session_explanation,
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

_HOMES = {
    "CompactionEntry": "sessions",
    "CompactionMark": "sessions",
    "CompactionReport": "compaction",
    "Explanation": "explain",
    "FlushMark": "sessions",
    "ImportReport": "transcripts",
    "LastCompaction": "explain",
    "NextTrigger": "sessions",
    "PromptCache": "sessions",
    "SessionCompaction": "compaction",
    "SessionDetail": "sessions",
    "SessionOverview": "sessions",
    "ShownMessage": "sessions",
    "TokenHistory": "sessions",
    "TranscriptCompaction": "transcripts",
    "TranscriptError": "transcripts",
    "TurnTokens": "sessions",
    "Uncompaction": "compaction",
    "UndoneCompaction": "compaction",
    "compact": "compaction",
    "compact_all": "compaction",
    "compact_session": "compaction",
    "compact_transcript": "transcripts",
    "explain_session": "explain",
    "export_messages": "transcripts",
    "export_session": "transcripts",
    "import_key": "transcripts",
    "import_messages": "transcripts",
    "import_session": "transcripts",
    "list_sessions": "sessions",
    "next_trigger": "sessions",
    "opened": "common",
    "pressure_tokens": "sessions",
    "preview": "explain",
    "read_transcript": "transcripts",
    "search_history": "sessions",
    "search_session_history": "sessions",
    "session_detail": "sessions",
    "session_explanation": "explain",
    "session_overview": "sessions",
    "show_session": "sessions",
    "token_history": "sessions",
    "uncompact_session": "compaction",
}
"""Each exported name and the module of this package that defines it."""

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
    "session_explanation",
    "session_overview",
    "show_session",
    "token_history",
    "uncompact_session",
]

__getattr__ = lazy_exports(__name__, _HOMES, globals())
