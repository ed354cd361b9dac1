"""outbox delivery state: failed tries, chunks already sent, the preview, the last error, given up

Revision ID: 0004
Revises: 0003
Create Date: 2026-12-03
"""

from __future__ import annotations

import sqlalchemy as sa
from alembic import op

revision = '0004'
down_revision = '0003'
branch_labels = None
depends_on = None


def upgrade() -> None:
    with op.batch_alter_table('outbox', schema=None) as batch_op:
        batch_op.add_column(
            sa.Column('attempts', sa.Integer(), server_default='0', nullable=False)
        )
        batch_op.add_column(
            sa.Column('sent_parts', sa.Integer(), server_default='0', nullable=False)
        )
        batch_op.add_column(sa.Column('preview_id', sa.String(), nullable=True))
        batch_op.add_column(sa.Column('last_error', sa.Text(), nullable=True))
        batch_op.add_column(sa.Column('given_up_at', sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    with op.batch_alter_table('outbox', schema=None) as batch_op:
        batch_op.drop_column('given_up_at')
        batch_op.drop_column('last_error')
        batch_op.drop_column('preview_id')
        batch_op.drop_column('sent_parts')
        batch_op.drop_column('attempts')
