"""initial schema: datasets, keys, releases, ledger

Revision ID: 0001
Revises: (none)
Create Date: 2026-11-29 17:24:26.199502
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0001'
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('dataset',
    sa.Column('id', sa.Uuid(), nullable=False),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('description', sa.Text(), nullable=False),
    sa.Column('lower', sa.Double(), nullable=False),
    sa.Column('upper', sa.Double(), nullable=False),
    sa.Column('neighbors', sa.String(length=16), nullable=False),
    sa.Column('granularity', sa.Double(), nullable=False),
    sa.Column('n', sa.BigInteger(), nullable=True),
    sa.Column('n_outside', sa.BigInteger(), nullable=True),
    sa.Column('data_version', sa.Integer(), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('values_uploaded_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('frozen_at', sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint("neighbors IN ('swap', 'add_remove')", name=op.f('ck_dataset_neighbors')),
    sa.CheckConstraint('granularity > 0', name=op.f('ck_dataset_granularity')),
    sa.CheckConstraint('lower < upper', name=op.f('ck_dataset_bounds')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_dataset')),
    sa.UniqueConstraint('name', name=op.f('uq_dataset_name'))
    )
    op.create_table('api_key',
    sa.Column('id', sa.Uuid(), nullable=False),
    sa.Column('prefix', sa.String(length=16), nullable=False),
    sa.Column('key_hash', sa.String(length=64), nullable=False),
    sa.Column('role', sa.String(length=16), nullable=False),
    sa.Column('dataset_id', sa.Uuid(), nullable=True),
    sa.Column('name', sa.String(length=200), nullable=False),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.Column('revoked_at', sa.DateTime(timezone=True), nullable=True),
    sa.CheckConstraint("role <> 'admin' OR dataset_id IS NULL", name=op.f('ck_api_key_admin_unscoped')),
    sa.CheckConstraint("role IN ('admin', 'analyst', 'viewer')", name=op.f('ck_api_key_role')),
    sa.ForeignKeyConstraint(['dataset_id'], ['dataset.id'], name=op.f('fk_api_key_dataset_id_dataset')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_api_key')),
    sa.UniqueConstraint('key_hash', name=op.f('uq_api_key_key_hash'))
    )
    op.create_index(op.f('ix_api_key_dataset_id'), 'api_key', ['dataset_id'], unique=False)
    op.create_table('dataset_data',
    sa.Column('dataset_id', sa.Uuid(), nullable=False),
    sa.Column('data', sa.LargeBinary(), nullable=False),
    sa.ForeignKeyConstraint(['dataset_id'], ['dataset.id'], name=op.f('fk_dataset_data_dataset_id_dataset')),
    sa.PrimaryKeyConstraint('dataset_id', name=op.f('pk_dataset_data'))
    )
    op.create_table('release',
    sa.Column('id', sa.Uuid(), nullable=False),
    sa.Column('seq', sa.BigInteger(), sa.Identity(always=False), nullable=False),
    sa.Column('dataset_id', sa.Uuid(), nullable=False),
    sa.Column('api_key_id', sa.Uuid(), nullable=True),
    sa.Column('method', sa.String(length=64), nullable=False),
    sa.Column('quantiles', postgresql.ARRAY(sa.Double()), nullable=False),
    sa.Column('estimates', postgresql.ARRAY(sa.Double()), nullable=False),
    sa.Column('epsilon', sa.Numeric(), nullable=False),
    sa.Column('delta', sa.Numeric(), nullable=True),
    sa.Column('cost_epsilon', sa.Numeric(), nullable=False),
    sa.Column('cost_delta', sa.Numeric(), nullable=False),
    sa.Column('remaining_epsilon', sa.Numeric(), nullable=False),
    sa.Column('remaining_delta', sa.Numeric(), nullable=False),
    sa.Column('idempotency_key', sa.String(length=255), nullable=True),
    sa.Column('request_hash', sa.String(length=64), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.ForeignKeyConstraint(['api_key_id'], ['api_key.id'], name=op.f('fk_release_api_key_id_api_key')),
    sa.ForeignKeyConstraint(['dataset_id'], ['dataset.id'], name=op.f('fk_release_dataset_id_dataset')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_release')),
    sa.UniqueConstraint('api_key_id', 'dataset_id', 'idempotency_key', name='uq_release_idem'),
    sa.UniqueConstraint('seq', name=op.f('uq_release_seq'))
    )
    op.create_index(op.f('ix_release_dataset_id'), 'release', ['dataset_id'], unique=False)
    op.create_table('ledger_entry',
    sa.Column('id', sa.BigInteger(), sa.Identity(always=False), nullable=False),
    sa.Column('dataset_id', sa.Uuid(), nullable=False),
    sa.Column('kind', sa.Text(), nullable=False),
    sa.Column('epsilon', sa.Numeric(), nullable=False),
    sa.Column('delta', sa.Numeric(), nullable=False),
    sa.Column('reason', sa.Text(), nullable=True),
    sa.Column('release_id', sa.Uuid(), nullable=True),
    sa.Column('api_key_id', sa.Uuid(), nullable=True),
    sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
    sa.CheckConstraint("(kind = 'debit') = (release_id IS NOT NULL)", name=op.f('ck_ledger_entry_debit_release')),
    sa.CheckConstraint("kind IN ('grant', 'debit')", name=op.f('ck_ledger_entry_kind')),
    sa.CheckConstraint('epsilon >= 0 AND delta >= 0', name=op.f('ck_ledger_entry_amounts')),
    sa.ForeignKeyConstraint(['api_key_id'], ['api_key.id'], name=op.f('fk_ledger_entry_api_key_id_api_key')),
    sa.ForeignKeyConstraint(['dataset_id'], ['dataset.id'], name=op.f('fk_ledger_entry_dataset_id_dataset')),
    sa.ForeignKeyConstraint(['release_id'], ['release.id'], name=op.f('fk_ledger_entry_release_id_release')),
    sa.PrimaryKeyConstraint('id', name=op.f('pk_ledger_entry')),
    sa.UniqueConstraint('release_id', name=op.f('uq_ledger_entry_release_id'))
    )
    op.create_index(op.f('ix_ledger_entry_dataset_id'), 'ledger_entry', ['dataset_id'], unique=False)


def downgrade() -> None:
    op.drop_index(op.f('ix_ledger_entry_dataset_id'), table_name='ledger_entry')
    op.drop_table('ledger_entry')
    op.drop_index(op.f('ix_release_dataset_id'), table_name='release')
    op.drop_table('release')
    op.drop_table('dataset_data')
    op.drop_index(op.f('ix_api_key_dataset_id'), table_name='api_key')
    op.drop_table('api_key')
    op.drop_table('dataset')
