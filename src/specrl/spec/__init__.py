"""Speculation: the exact verifier and the proposers (draft mechanisms)."""
from specrl.spec.proposer import Proposal, ProposalContext, Proposer
from specrl.spec.verify import verify

__all__ = ["Proposal", "ProposalContext", "Proposer", "verify"]
