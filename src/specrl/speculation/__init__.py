"""Speculation: the exact verifier and the proposers (draft mechanisms)."""
from specrl.speculation.proposer import Proposal, ProposalContext, Proposer
from specrl.speculation.verify import verify

__all__ = ["Proposal", "ProposalContext", "Proposer", "verify"]
