"""Drop ix_messages_session_id: uq_messages_session_seq (session_id, seq) and ix_messages_pending
(session_id, handled) both lead with session_id, so it only cost every write of a message row
(stored, placed, answered: three a message) an index entry more (issue 24)

Revision ID: 0008
Revises: 0007
Create Date: 2026-12-04
"""

from __future__ import annotations

from alembic import op

revision = '0008'
down_revision = '0007'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('messages', schema=None) as batch_op:
        batch_op.drop_index('ix_messages_session_id')


def downgrade() -> None:
    with op.batch_alter_table('messages', schema=None) as batch_op:
        batch_op.create_index('ix_messages_session_id', ['session_id'], unique=False)
