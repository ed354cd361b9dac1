"""turn_records.cached_tokens and sessions.tokens_cached: the prompt tokens the provider read
from its prompt cache, per turn and per session (issue 24)

Revision ID: 0007
Revises: 0006
Create Date: 2026-12-06
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0007'
down_revision = '0006'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('turn_records', schema=None) as batch_op:
        batch_op.add_column(sa.Column('cached_tokens', sa.Integer(), nullable=True))
    with op.batch_alter_table('sessions', schema=None) as batch_op:
        batch_op.add_column(sa.Column('tokens_cached', sa.Integer(), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('sessions', schema=None) as batch_op:
        batch_op.drop_column('tokens_cached')
    with op.batch_alter_table('turn_records', schema=None) as batch_op:
        batch_op.drop_column('cached_tokens')
