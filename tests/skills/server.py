"""A bundle that serves one skill (SEP-2640) with the published
nimblebrain-bundle-sdk 0.2.0 `SkillsExtension` on FastMCP, for
tests/skills.rs; built into target/nb-skills-bundle by `make skills-bundle`."""
from fastmcp import FastMCP
from nimblebrain_bundle_sdk.skills import SkillDefinition, SkillsExtension

mcp = FastMCP("nb-skills")
mcp.add_extension(SkillsExtension([SkillDefinition("release-notes", {
    "SKILL.md": "---\nname: release-notes\ndescription: Write the release notes of a version.\n---\n# Release notes\nList what changed, newest first.\n",
    "template.md": "## Version {version}\n",
})]))

if __name__ == "__main__":
    mcp.run()
